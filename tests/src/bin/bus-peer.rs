//! A host on the bus for process-level tests: connects as `--host` through
//! the bus shell, publishes sample telemetry every 100 ms and an event per
//! second until it is killed. Prints `connected` on stdout once connected.

use std::time::Duration;

use loopwarden_bus::{now_ms, BrokerAddr, Bus, BusConfig};
use loopwarden_protocol::{samples, Event, GpuIndex, Ident, Message, NodeId, Role};

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let broker: BrokerAddr = args
        .next()
        .expect("broker")
        .parse()
        .expect("broker address");
    let site = Ident::new(&args.next().expect("site")).expect("site ident");
    let host = NodeId::new(Role::Host, &args.next().expect("host")).expect("host ident");
    let (bus, _inbound, _task) = Bus::start(BusConfig::new(broker, site, host));
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
