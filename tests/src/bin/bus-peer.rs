//! A host on the bus for process-level tests. Connects as `HOST` through the
//! bus shell and publishes until it is killed.
//!
//! `bus-peer BROKER SITE HOST`: sample telemetry every 100 ms and an XID
//! event every second. Prints `connected` once connected.
//!
//! `bus-peer BROKER SITE HOST --flash FILE [--period MS]`: the agents' way:
//! the flash file of `boards/flash/host-file.toml` holds the event log, the
//! outbox and the config store. Every period it logs an event and publishes
//! it through the outbox, printing `logged <record seq>` once the record is
//! in flash and `queued <frame seq>` once the frame is in the outbox. At
//! start it prints `opened next_record=<n> first_frame=<n> pending=<n>`.

use std::io::Write;
use std::time::Duration;

use loopwarden_boards::FlashBoard;
use loopwarden_bus::{now_ms, BrokerAddr, Bus, BusConfig};
use loopwarden_flash::{ConfigStore, EventLog, FileFlash, Outbox, SharedFlash};
use loopwarden_protocol::{
    samples, CapSource, Event, GpuIndex, Ident, Message, MessageKind, NodeId, Role, Watts,
};

const USAGE: &str = "usage: bus-peer BROKER SITE HOST [--flash FILE [--period MS]]";

/// The broker, site and host of the command line, or what is wrong with it.
fn parse_peer(args: &[String]) -> Result<(BrokerAddr, Ident, NodeId), String> {
    let [broker, site, host, ..] = args else {
        return Err(format!("{} of 3 arguments given", args.len()));
    };
    let broker = broker
        .parse()
        .map_err(|e| format!("broker \"{broker}\": {e}"))?;
    let site = Ident::new(site).map_err(|e| format!("site \"{site}\": {e}"))?;
    let host = NodeId::new(Role::Host, host).map_err(|e| format!("host \"{host}\": {e}"))?;
    Ok((broker, site, host))
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (broker, site, host) = match parse_peer(&args) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("bus-peer: {e}\n{USAGE}");
            std::process::exit(2);
        }
    };
    let opt = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .map(|i| args[i + 1].clone())
    };
    let mut config = BusConfig::new(broker, site, host);
    match opt("--flash") {
        None => plain(config).await,
        Some(path) => {
            let period = opt("--period").map_or(20, |p| p.parse().expect("--period in ms"));
            let board = FlashBoard::host_file();
            let flash =
                FileFlash::<4, 4096>::open(path.as_ref(), &board.geometry()).expect("flash file");
            let flash = SharedFlash::new(flash);
            let layout = board.layout();
            let mut cfg = ConfigStore::open(flash.clone(), layout.config).expect("config store");
            config.first_seq = cfg.reserve_seq(1000).await.expect("sequence reservation");
            let mut log = EventLog::open(flash.clone(), layout.log)
                .await
                .expect("event log");
            let mut outbox = Outbox::open(flash, layout.outbox).await.expect("outbox");
            let mut pending = 0;
            outbox.for_each(|_| pending += 1).await.expect("outbox");
            println!(
                "opened next_record={} first_frame={} pending={pending}",
                log.next_seq(),
                config.first_seq
            );
            let (bus, _inbound, _task) = Bus::start_with_outbox(config, Box::new(outbox));
            let gpu = GpuIndex::new(0).expect("GPU 0");
            let mut out = std::io::stdout();
            for i in 0u32.. {
                // Every fifth decision is a cap (critical), the others XIDs.
                let event = if i % 5 == 4 {
                    Event::CapApplied {
                        gpu,
                        limit: Watts(500),
                        source: Some(CapSource::Cooling),
                    }
                } else {
                    Event::Xid { gpu, xid: 13 }
                };
                let message = Message::Event(event);
                let body = postcard_body(&message);
                let time = now_ms();
                let record = log
                    .append(time, MessageKind::Event as u8, &body)
                    .await
                    .expect("log append");
                writeln!(out, "logged {record}").ok();
                match bus.publish(message, time) {
                    Ok(frame) => writeln!(out, "queued {}", frame.seq).ok(),
                    Err(e) => writeln!(out, "refused {e}").ok(),
                };
                out.flush().ok();
                tokio::time::sleep(Duration::from_millis(period)).await;
            }
        }
    }
}

/// The postcard body of an event, as the log stores it.
fn postcard_body(message: &Message) -> Vec<u8> {
    let Message::Event(e) = message else {
        unreachable!("only events are logged here")
    };
    postcard::to_allocvec(e).expect("an event encodes")
}

async fn plain(config: BusConfig) {
    let (bus, _inbound, _task) = Bus::start(config);
    assert!(
        bus.wait_connected(Duration::from_secs(10)).await,
        "not connected"
    );
    println!("connected");
    let mut tick = 0u64;
    loop {
        let _ = bus.publish(Message::HostTelemetry(samples::host_telemetry(8)), now_ms());
        if tick % 10 == 0 {
            let gpu = GpuIndex::new(0).expect("GPU 0");
            let _ = bus.publish(Message::Event(Event::Xid { gpu, xid: 13 }), now_ms());
        }
        tick += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
