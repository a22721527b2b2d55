//! What the gateway's tests share: a scripted microcontroller speaking
//! `loopwarden-link` frames on a TCP port the gateway connects to (as it
//! connects to QEMU's UART), a status it says, and the gateway's process
//! with its configuration. Each test crate uses part of it.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use loopwarden_link::frame::{encode, max_frame, OVERHEAD};
use loopwarden_link::MAX_MESSAGE;
use loopwarden_link::{Cost, Deframer, Down, Fed, Hello, RackBits, ResetCause, Status, Up};
use loopwarden_protocol::message::{CduMode, Pump};
use loopwarden_protocol::{Family, Ident, ReasonCode, Role, Topic};
use loopwarden_system_tests::Mosquitto;

pub const BIN: &str = env!("CARGO_BIN_EXE_cooling-ctrl");
pub const SITE: &str = "hall-t";
pub const CDU: &str = "cdu-1";
/// Host index 5 of `r{rack}h{host}` with four hosts a rack.
pub const HOST_5: &str = "r1h1";

pub fn id(s: &str) -> Ident {
    Ident::new(s).expect("an ident")
}

pub fn topic(role: Role, node: &str, family: Family) -> String {
    Topic::new(&id(SITE), role, &id(node), family).to_string()
}

/// The scripted microcontroller: frames out, numbered from 0; frames in,
/// deframed.
pub struct Mcu {
    line: TcpStream,
    seq: u32,
    deframer: Box<Deframer<{ max_frame(MAX_MESSAGE) }>>,
}

impl Mcu {
    /// Waits up to 15 s for the gateway to connect to `listener`.
    pub fn accept(listener: &TcpListener) -> Mcu {
        listener.set_nonblocking(true).unwrap();
        let deadline = Instant::now() + Duration::from_secs(15);
        let line = loop {
            match listener.accept() {
                Ok((s, _)) => break s,
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                Err(e) => panic!("the gateway never connected to the MCU's port: {e}"),
            }
        };
        line.set_nonblocking(false).unwrap();
        line.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        Mcu {
            line,
            seq: 0,
            deframer: Box::default(),
        }
    }

    pub fn frame(up: &Up, seq: u32) -> Vec<u8> {
        let mut scratch = vec![0u8; MAX_MESSAGE + OVERHEAD];
        let mut out = vec![0u8; max_frame(MAX_MESSAGE)];
        let n = encode(up, seq, &mut scratch, &mut out).expect("a frame");
        out.truncate(n);
        out
    }

    pub fn send(&mut self, up: &Up) {
        let f = Self::frame(up, self.seq);
        self.seq += 1;
        self.line
            .write_all(&f)
            .expect("the gateway takes the frame");
    }

    /// Says hello as a microcontroller that has just powered on (boot 1,
    /// nothing restored).
    pub fn hello(&mut self) {
        self.send(&Up::Hello(Hello {
            boot: 1,
            reset: ResetCause::PowerOn,
            firmware: heapless::String::try_from("test").unwrap(),
            restored: false,
        }));
    }

    /// Sends `up` with one byte of its body flipped.
    pub fn send_corrupt(&mut self, up: &Up) {
        let mut f = Self::frame(up, self.seq);
        self.seq += 1;
        f[12] ^= 0x5a;
        if f[12] == 0 {
            f[12] = 1;
        }
        self.line
            .write_all(&f)
            .expect("the gateway takes the bytes");
    }

    /// What came from the gateway within `wait`.
    pub fn downs(&mut self, wait: Duration) -> Vec<(u32, Down)> {
        let deadline = Instant::now() + wait;
        let mut got = Vec::new();
        let mut buf = [0u8; 2048];
        while Instant::now() < deadline {
            let n = match self.line.read(&mut buf) {
                Ok(0) => panic!("the gateway closed the MCU's line"),
                Ok(n) => n,
                Err(_) => continue,
            };
            for b in &buf[..n] {
                match self.deframer.push(*b) {
                    Fed::Frame(r) => got.push((r.seq, r.message::<Down>().expect("a Down"))),
                    Fed::Dropped(e) => panic!("the gateway sent a bad frame: {e}"),
                    Fed::More => {}
                }
            }
        }
        got
    }
}

/// A status of step `step`: normal, rack 1's cooling lost, the setpoint
/// `setpoint_c`.
pub fn status(step: u32, setpoint_c: f32) -> Up {
    Up::Status(Status {
        step,
        at_ms: u64::from(step) * 1_000,
        mode: (CduMode::Normal, ReasonCode::OK, 0),
        setpoint_c,
        pump_speed: 0.6,
        pump_on: [true, false],
        lead: Pump::A,
        racks: RackBits {
            valves_open: 0b1101,
            cooling_lost: 0b0010,
            leaks_latched: 0b0010,
            ..RackBits::default()
        },
        pumps_failed: [false; 2],
        beacon: true,
        sensor_faults: [None; 4],
        readings: Some(cooling_decide::CduMeasurements {
            supply_c: Some(31.8),
            return_c: Some(40.2),
            flow_lpm: Some(600.0),
            ..Default::default()
        }),
        outdoor_c: Some(14.0),
        writes_ok: true,
        events_dropped: 0,
        cost: Cost::default(),
    })
}

/// The gateway's configuration in `dir` (`cdu.toml`): this CDU of
/// `SITE` on `broker`, the demonstration key, hosts `r{rack}h{host}`,
/// its flash and console socket (`cdu.sock`) in `dir`, and `extra` lines.
pub fn config(dir: &Path, broker: &Mosquitto, extra: &str) -> PathBuf {
    let config = dir.join("cdu.toml");
    // No CDU link: the microcontroller drives the CDU.
    std::fs::write(
        &config,
        format!(
            "site = \"{SITE}\"\ncdu = \"{CDU}\"\nbroker = \"127.0.0.1:{}\"\ndemo_key = true\n\
             hosts_pattern = \"r{{rack}}h{{host}}\"\n\
             flash = {:?}\nconsole = {:?}\n{extra}",
            broker.port(),
            dir.join("cdu.flash"),
            dir.join("cdu.sock"),
        ),
    )
    .unwrap();
    config
}

/// The gateway on `config`, reaching the MCU on `mcu`.
pub fn spawn(config: &Path, mcu: SocketAddr) -> Running {
    let child = Command::new(BIN)
        .args(["gateway", "--link", &format!("tcp:{mcu}"), "--config"])
        .arg(config)
        .env("RUST_LOG", "info,rumqttc=warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start cooling-ctrl gateway");
    Running(child)
}

/// The gateway's process, killed if the test ends before it stops.
pub struct Running(pub Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
