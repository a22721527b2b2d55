//! What `cooling-ctrl gateway` carries into a microcontroller besides
//! host reports, as a process against a real mosquitto with a scripted
//! microcontroller (`gateway_mcu`):
//! - the BMS, over Modbus TCP on `run`'s northbound server, reads the
//!   microcontroller's last status and writes its limits and the outdoor
//!   temperature, which reach the microcontroller as `Down::Limits` and
//!   `Down::Outdoor`;
//! - an operator's clear, signed by `cooling-ctrl ctl clear-leak
//!   --sign-key` with the operator's own key, reaches it as `Down::Clear`
//!   whose signature verifies with the operator's public key, and its
//!   `Up::Answer` is what `ctl` prints; a second clear asked at once has
//!   an id above the first's;
//! - a clear signed with another key is carried all the same: the
//!   microcontroller refuses it, not the gateway;
//! - the BMS's limits outlive a restart of the gateway (kept in flash);
//! - the BMS's outdoor temperature reads back only while the
//!   microcontroller holds it: not when written while the line is
//!   closed, not after the microcontroller started again;
//! - an answer that comes after its clear was said unanswered is counted
//!   late, not done.
//!
//! And `cooling-ctrl firmware-keyring` writes the firmware's operator
//! keyring from a site's keyring.
//!
//! Skipped when mosquitto is not installed, except under CI (`CI=true`).

mod bms_client;
mod gateway_mcu;

use std::net::{SocketAddr, TcpListener};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use gateway_mcu::{config, spawn, status, Mcu, BIN, CDU};
use loopwarden_bus::keys::{hex, SignKey};
use loopwarden_link::message::CLEAR_CONTEXT;
use loopwarden_link::{ClearAction, Down, SignedClear, Up};
use loopwarden_protocol::auth::{Signature, SigningKey, VerifyingKey};
use loopwarden_protocol::{NodeId, Role};
use loopwarden_system_tests::prometheus::http_get;
use loopwarden_system_tests::{free_port, Mosquitto};
use tokio_modbus::client::{Reader, Writer};

const OPERATOR: &str = "jdoe";

/// Operator `jdoe`'s sign key from `seed`, written to `dir/name` (mode
/// 0600, as `lwbus pki sign-key` writes it).
fn sign_key(dir: &Path, name: &str, seed: u8) -> (PathBuf, VerifyingKey) {
    let key = SignKey {
        node: NodeId::new(Role::Operator, OPERATOR).unwrap(),
        key_id: 1,
        key: SigningKey::from_bytes(&[seed; 32]),
    };
    let path = dir.join(name);
    std::fs::write(&path, key.to_toml()).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    (path, key.key.verifying_key())
}

/// Whether `key` signed `c`, checked here as the firmware checks it: the
/// context, then the clear's postcard bytes, strict Ed25519.
fn signed_by(c: &SignedClear, key: &VerifyingKey) -> bool {
    let mut buf = [0u8; 160];
    let head = CLEAR_CONTEXT.len();
    buf[..head].copy_from_slice(CLEAR_CONTEXT);
    let n = postcard::to_slice(&c.clear, &mut buf[head..])
        .unwrap()
        .len();
    let sig = Signature::from_components(c.signature[0], c.signature[1]);
    key.verify_strict(&buf[..head + n], &sig).is_ok()
}

/// Reads what comes down for up to `within`, sending a status every
/// 300 ms (a live MCU speaks every step), until `want` takes one.
fn down_until<T>(
    mcu: &mut Mcu,
    step: &mut u32,
    within: Duration,
    what: &str,
    mut want: impl FnMut(&Down) -> Option<T>,
) -> T {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        mcu.send(&status(*step, 32.0));
        *step += 1;
        for (_, d) in mcu.downs(Duration::from_millis(300)) {
            if let Some(t) = want(&d) {
                return t;
            }
        }
    }
    panic!("{what}: not come down within {within:?}");
}

/// `cooling-ctrl ctl --console SOCKET ARGS…` in a thread of its own.
fn ctl(socket: &Path, args: &[&str]) -> std::thread::JoinHandle<Output> {
    let mut cmd = Command::new(BIN);
    cmd.arg("ctl").arg("--console").arg(socket).args(args);
    std::thread::spawn(move || cmd.output().expect("run cooling-ctrl ctl"))
}

/// A clear down, the MCU answering it with `outcome`; what `ctl` said.
fn clear_answered(
    mcu: &mut Mcu,
    step: &mut u32,
    asked: std::thread::JoinHandle<Output>,
    outcome: Result<(), &str>,
) -> (SignedClear, Output) {
    let clear = down_until(
        mcu,
        step,
        Duration::from_secs(10),
        "the clear",
        |d| match d {
            Down::Clear(c) => Some(c.clone()),
            _ => None,
        },
    );
    mcu.send(&Up::Answer {
        id: clear.clear.id,
        outcome: outcome.map_err(|w| heapless::String::try_from(w).unwrap()),
    });
    // The MCU goes on speaking while `ctl` waits for its answer.
    let deadline = Instant::now() + Duration::from_secs(15);
    while !asked.is_finished() && Instant::now() < deadline {
        mcu.send(&status(*step, 32.0));
        *step += 1;
        mcu.downs(Duration::from_millis(200));
    }
    (clear, asked.join().unwrap())
}

/// Reads the BMS's registers and writes its limits and the outdoor
/// temperature as a BMS does, on the northbound server at `addr`: the
/// input registers 0..33, and the holding registers read back.
fn bms(addr: SocketAddr) -> (Vec<u16>, Vec<u16>) {
    let (rt, mut ctx) = bms_client::connect(addr);
    rt.block_on(async {
        let input = ctx
            .read_input_registers(0, 33)
            .await
            .unwrap()
            .expect("read");
        // Ceiling 35.50 °C and offset -2.0 K in one write; then the
        // outdoor temperature, -4.50 °C.
        ctx.write_multiple_registers(0, &[3550, (-20i16) as u16])
            .await
            .unwrap()
            .expect("the limits accepted");
        ctx.write_single_register(3, (-450i16) as u16)
            .await
            .unwrap()
            .expect("the outdoor temperature accepted");
        // Read back once, straight after the writes, as a BMS's
        // write-verify does: the server answers a write once the holding
        // registers read it.
        let holding = ctx
            .read_holding_registers(0, 4)
            .await
            .unwrap()
            .expect("read back");
        (input, holding)
    })
}

#[test]
fn the_bms_writes_and_operators_signed_clears_reach_the_microcontroller() {
    let Some(broker) = Mosquitto::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let northbound: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let config = config(
        dir.path(),
        &broker,
        &format!("northbound = \"{northbound}\"\nnorthbound_writes = true\n"),
    );
    let gateway = spawn(&config, listener.local_addr().unwrap());
    let mut mcu = Mcu::accept(&listener);
    let socket = dir.path().join("cdu.sock");
    let mut step = 100;

    // The BMS reads the last status (normal, setpoint 32.00 °C, supply
    // 31.80 °C, rack 1's leak latched) and writes.
    let started = Instant::now();
    let (input, holding) = loop {
        down_until(&mut mcu, &mut step, Duration::from_secs(5), "alive", |d| {
            matches!(d, Down::Alive { .. }).then_some(())
        });
        let (input, holding) = bms(northbound);
        if input[0] == 1 || started.elapsed() > Duration::from_secs(15) {
            break (input, holding);
        }
    };
    assert_eq!(input[0], 1, "mode normal, from the status: {input:?}");
    assert_eq!((input[6], input[7]), (3200, 3180), "setpoint, supply");
    assert_eq!(input[17], 0b0010, "leaks latched");
    assert_eq!(input[20], 0x8000, "hottest GPU: not known here");
    assert_eq!(input[21], 0x8000, "proposed setpoint: not known here");
    assert_eq!(input[23], 0xFFFF, "rejection short: not known here");
    assert_eq!(input[32], 1, "writes enabled");
    assert_eq!(&holding[..2], &[3550, (-20i16) as u16], "what was sent");
    assert_eq!(holding[3], (-450i16) as u16);
    let (limits, outdoor) = (
        Down::Limits {
            ceiling_c: 35.5,
            offset_k: -2.0,
        },
        Down::Outdoor(-4.5),
    );
    let mut seen = (false, false);
    down_until(
        &mut mcu,
        &mut step,
        Duration::from_secs(10),
        "the BMS's writes",
        |d| {
            seen.0 |= *d == limits;
            seen.1 |= *d == outdoor;
            (seen == (true, true)).then_some(())
        },
    );

    // The operator's clear, signed with the operator's own key.
    let (key, public) = sign_key(dir.path(), "jdoe.sign.key", 7);
    let key = key.to_str().unwrap();
    let asked = ctl(
        &socket,
        &["clear-leak", "1", "--sign-key", key, "--cdu", CDU],
    );
    let (clear, said) = clear_answered(&mut mcu, &mut step, asked, Ok(()));
    assert_eq!(clear.clear.action, ClearAction::Leak(1));
    assert_eq!(
        (clear.clear.cdu.as_str(), clear.clear.operator.as_str()),
        (CDU, OPERATOR)
    );
    assert!(signed_by(&clear, &public), "signed with the operator's key");
    let out = String::from_utf8_lossy(&said.stdout);
    assert!(said.status.success(), "{said:?}");
    assert!(
        out.contains("rack 1's leak") && out.contains("cleared by the microcontroller"),
        "{out}"
    );

    // A second clear asked the moment the first was answered (a script
    // clearing a leak, then a pump) has an id of its own, above the
    // first's: the MCU would refuse the same id as a replay.
    let asked = ctl(
        &socket,
        &["clear-pump", "A", "--sign-key", key, "--cdu", CDU],
    );
    let (second, said) = clear_answered(&mut mcu, &mut step, asked, Ok(()));
    assert!(said.status.success(), "{said:?}");
    assert!(
        second.clear.id > clear.clear.id,
        "ids {} then {}",
        clear.clear.id,
        second.clear.id
    );
    assert!(signed_by(&second, &public));

    // Signed with another key: carried all the same, refused by the MCU,
    // its refusal printed.
    let (other, _) = sign_key(dir.path(), "other.sign.key", 9);
    let other = other.to_str().unwrap();
    let asked = ctl(
        &socket,
        &["clear-pump", "B", "--sign-key", other, "--cdu", CDU],
    );
    let why = "its signature does not verify (another key signed, or the clear was altered)";
    let (clear, said) = clear_answered(&mut mcu, &mut step, asked, Err(why));
    assert!(!signed_by(&clear, &public), "not the operator's signature");
    assert_eq!(said.status.code(), Some(1), "{said:?}");
    let out = String::from_utf8_lossy(&said.stdout);
    assert!(out.starts_with("refused: ") && out.contains(why), "{out}");

    // Unsigned, a gateway carries nothing, and says why.
    let said = ctl(&socket, &["clear-leak", "1"]).join().unwrap();
    assert_eq!(said.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&said.stderr).contains("--sign-key"),
        "{said:?}"
    );

    // The gateway killed and started again, the microcontroller running
    // on: the BMS's limits, kept in flash, come down again at once and
    // the holding registers read them, with no write from the BMS (it
    // writes a limit once, when it changes).
    drop(gateway);
    let _gateway = spawn(&config, listener.local_addr().unwrap());
    let mut mcu = Mcu::accept(&listener);
    // Within 5 s: not the 30 s repeat.
    down_until(
        &mut mcu,
        &mut step,
        Duration::from_secs(5),
        "the kept limits",
        |d| (*d == limits).then_some(()),
    );
    let (rt, mut ctx) = bms_client::connect(northbound);
    let holding = rt
        .block_on(ctx.read_holding_registers(0, 2))
        .unwrap()
        .expect("read");
    assert_eq!(
        holding,
        [3550, (-20i16) as u16],
        "the kept limits read back"
    );
}

/// The northbound server at `addr`, connected once it serves (the
/// gateway binds it as it starts); panics after 10 s.
fn bms_when_served(addr: SocketAddr) -> (tokio::runtime::Runtime, tokio_modbus::client::Context) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(addr).is_err() {
        assert!(
            Instant::now() < deadline,
            "the northbound server at {addr} never served"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    bms_client::connect(addr)
}

/// `outdoor_temp` (holding 3) reads a value only while the
/// microcontroller holds it: a write made while the line is closed never
/// reaches it (and is not sent later: it would look new), and a
/// microcontroller that started again forgot the value it held.
#[test]
fn the_outdoor_temperature_reads_back_only_while_the_microcontroller_holds_it() {
    let Some(broker) = Mosquitto::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // Nobody at the MCU's port yet: the line cannot open.
    let mcu_at: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let northbound: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let config = config(
        dir.path(),
        &broker,
        &format!("northbound = \"{northbound}\"\nnorthbound_writes = true\n"),
    );
    let _gateway = spawn(&config, mcu_at);
    let (rt, mut ctx) = bms_when_served(northbound);
    let minus_4_50 = (-450i16) as u16;
    let write_outdoor = |ctx: &mut tokio_modbus::client::Context| {
        rt.block_on(ctx.write_single_register(3, minus_4_50))
            .unwrap()
            .expect("the write answered");
        rt.block_on(ctx.read_holding_registers(3, 1))
            .unwrap()
            .expect("read back")[0]
    };
    assert_eq!(
        write_outdoor(&mut ctx),
        0x8000,
        "written while the line is closed: not in force"
    );

    // The line opens: the value written meanwhile does not come down.
    let listener = TcpListener::bind(mcu_at).unwrap();
    let mut mcu = Mcu::accept(&listener);
    let mut step = 1;
    let mut came = Vec::new();
    let heard_from = Instant::now();
    while heard_from.elapsed() < Duration::from_secs(2) {
        mcu.send(&status(step, 32.0));
        step += 1;
        came.extend(
            mcu.downs(Duration::from_millis(300))
                .into_iter()
                .map(|(_, d)| d),
        );
    }
    assert!(
        came.iter().any(|d| matches!(d, Down::Alive { .. })),
        "{came:?}"
    );
    assert!(
        !came.iter().any(|d| matches!(d, Down::Outdoor(_))),
        "{came:?}"
    );

    // Written with the line open: it comes down and reads back.
    assert_eq!(write_outdoor(&mut ctx), minus_4_50);
    down_until(
        &mut mcu,
        &mut step,
        Duration::from_secs(5),
        "the outdoor temperature",
        |d| (*d == Down::Outdoor(-4.5)).then_some(()),
    );

    // The microcontroller starts again: it holds no value of the BMS.
    mcu.hello();
    let deadline = Instant::now() + Duration::from_secs(5);
    let read = loop {
        mcu.send(&status(step, 32.0));
        step += 1;
        mcu.downs(Duration::from_millis(200));
        let read = rt
            .block_on(ctx.read_holding_registers(3, 1))
            .unwrap()
            .expect("read")[0];
        if read == 0x8000 || Instant::now() > deadline {
            break read;
        }
    };
    assert_eq!(
        read, 0x8000,
        "a value the microcontroller forgot at its start"
    );
}

/// The gateway's `clears_total{outcome}` at `metrics`, once `done` holds
/// of them; panics after 5 s.
fn clears_when(metrics: SocketAddr, done: impl Fn(&[u64; 4]) -> bool) -> [u64; 4] {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (_, text) = http_get(metrics, "/metrics").expect("/metrics answers");
        let of = |outcome: &str| {
            let tag = format!("outcome=\"{outcome}\"}} ");
            text.lines()
                .filter(|l| l.starts_with("loopwarden_gateway_clears_total{"))
                .find_map(|l| l.split_once(&tag)?.1.parse().ok())
                .unwrap_or(0)
        };
        let got = ["forwarded", "done", "unanswered", "late"].map(of);
        if done(&got) {
            return got;
        }
        assert!(Instant::now() < deadline, "clears {got:?}:\n{text}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn an_answer_after_the_clear_went_unanswered_is_counted_late_not_done() {
    let Some(broker) = Mosquitto::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (key, _) = sign_key(dir.path(), "jdoe.key", 7);
    let key = key.to_str().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let metrics: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let config = config(
        dir.path(),
        &broker,
        &format!("metrics_listen = \"{metrics}\"\n"),
    );
    let _gateway = spawn(&config, listener.local_addr().unwrap());
    let mut mcu = Mcu::accept(&listener);
    mcu.hello();
    let mut step = 1;
    let socket = dir.path().join("cdu.sock");
    let asked = ctl(
        &socket,
        &["clear-leak", "1", "--sign-key", key, "--cdu", CDU],
    );
    let clear = down_until(
        &mut mcu,
        &mut step,
        Duration::from_secs(10),
        "the clear",
        |d| match d {
            Down::Clear(c) => Some(c.clone()),
            _ => None,
        },
    );
    // The MCU goes on speaking, and answers only after the gateway gave
    // up waiting (10 s).
    let deadline = Instant::now() + Duration::from_secs(15);
    while !asked.is_finished() && Instant::now() < deadline {
        mcu.send(&status(step, 32.0));
        step += 1;
        mcu.downs(Duration::from_millis(200));
    }
    let said = String::from_utf8_lossy(&asked.join().unwrap().stderr).into_owned();
    assert!(
        said.contains("did not answer") || said.contains("no answer"),
        "{said}"
    );
    mcu.send(&Up::Answer {
        id: clear.clear.id,
        outcome: Ok(()),
    });
    let [forwarded, done, unanswered, late] = clears_when(metrics, |c| c[3] > 0 || c[1] > 0);
    assert_eq!(
        (forwarded, done, unanswered, late),
        (1, 0, 1, 1),
        "the outcomes add up to what was forwarded"
    );
}

#[test]
fn the_firmware_keyring_is_written_from_the_sites_keyring() {
    let dir = tempfile::tempdir().unwrap();
    let public = SigningKey::from_bytes(&[7; 32]).verifying_key();
    let ring = dir.path().join("keyring.toml");
    std::fs::write(
        &ring,
        format!(
            "site = \"hall-t\"\n\n[[signer]]\nnode = \"cdu/{CDU}\"\nkey_id = 1\n\
             public_key = \"{}\"\nmay = [\"lease\"]\n\n[[signer]]\nnode = \"operator/{OPERATOR}\"\n\
             key_id = 3\npublic_key = \"{}\"\nmay = [\"lease\", \"release\"]\n",
            hex(SigningKey::from_bytes(&[1; 32]).verifying_key().as_bytes()),
            hex(public.as_bytes()),
        ),
    )
    .unwrap();
    let out = Command::new(BIN)
        .args(["firmware-keyring", "--cdu", CDU, "--keyring"])
        .arg(&ring)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    let v: toml::Value = toml::from_str(&text).unwrap();
    assert_eq!(v["cdu"].as_str(), Some(CDU));
    let ops = v["operator"].as_array().unwrap();
    assert_eq!(ops.len(), 1, "the operator, not the CDU: {text}");
    assert_eq!(ops[0]["name"].as_str(), Some(OPERATOR));
    assert_eq!(ops[0]["key_id"].as_integer(), Some(3));
    assert_eq!(
        ops[0]["public_key"].as_str(),
        Some(hex(public.as_bytes()).as_str())
    );
}
