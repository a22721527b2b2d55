//! The CDU client's read-back of the one-word settings over Modbus TCP
//! against a CDU that does not answer it: after a run's request goes
//! unanswered, the later runs are not tried (each would wait out its own
//! timeout), as a read's or a step's writes are not.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cooling_ctrl::decide::{Setting, Write};
use cooling_ctrl::modbus::{CduPort, Link, ModbusCdu};
use loopwarden_boards::modbus_map::RegisterMap;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const MAP: &str = include_str!("../../boards/cdus/sim-cdu.toml");

/// The simulated CDU's map with each `(from, to)` replaced (once).
fn map_with(changes: &[(&str, &str)]) -> RegisterMap {
    let mut toml = MAP.to_string();
    for (from, to) in changes {
        assert!(toml.contains(from), "the shipped map has {from:?}");
        toml = toml.replacen(from, to, 1);
    }
    RegisterMap::from_toml(&toml, "test map").expect("a valid map")
}

/// A Modbus TCP CDU that never answers function 3 (the request counted
/// in `reads`) and echoes function 6 and 16 as the specification asks.
async fn serve_no_read_back(reads: Arc<AtomicUsize>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let reads = reads.clone();
            tokio::spawn(async move {
                let mut head = [0u8; 7];
                while stream.read_exact(&mut head).await.is_ok() {
                    let len = usize::from(u16::from_be_bytes([head[4], head[5]]));
                    let mut pdu = vec![0u8; len.saturating_sub(1)];
                    if stream.read_exact(&mut pdu).await.is_err() {
                        return;
                    }
                    let answer: Vec<u8> = match pdu.first() {
                        Some(3) => {
                            reads.fetch_add(1, Ordering::SeqCst);
                            continue;
                        }
                        Some(6) | Some(16) => pdu[..5].to_vec(),
                        _ => vec![pdu[0] | 0x80, 1],
                    };
                    let mut frame = head[..4].to_vec();
                    frame.extend_from_slice(&(answer.len() as u16 + 1).to_be_bytes());
                    frame.push(head[6]);
                    frame.extend_from_slice(&answer);
                    if stream.write_all(&frame).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

#[tokio::test]
async fn after_a_read_back_request_goes_unanswered_the_later_runs_are_not_tried() {
    // Holding registers 0 (supply_setpoint), 10 (lead_pump) and 20
    // (valves_open): three runs, three requests if each were tried.
    let map = map_with(&[
        (
            "name = \"lead_pump\"\nkind = \"holding\"\naddress = 2",
            "name = \"lead_pump\"\nkind = \"holding\"\naddress = 10",
        ),
        (
            "name = \"valves_open\"\nkind = \"holding\"\naddress = 3",
            "name = \"valves_open\"\nkind = \"holding\"\naddress = 20",
        ),
    ]);
    let reads = Arc::new(AtomicUsize::new(0));
    let addr = serve_no_read_back(reads.clone()).await;
    let timeout = Duration::from_millis(300);
    let mut client = ModbusCdu::new(map, Link::Tcp(addr.into())).with_timeout(timeout);
    let writes = [
        (Setting::Setpoint, 40.0),
        (Setting::LeadPump, 1.0),
        (Setting::Valves, 5.0),
    ]
    .map(|(setting, value)| Write { setting, value });
    for w in &writes {
        client.write_setting(w).await.expect("echoed right");
    }
    let back = client.read_back(&writes).await;
    // One request, so one timeout waited: the count, not the clock, says
    // so (a loaded machine stretches any time measured here).
    assert_eq!(reads.load(Ordering::SeqCst), 1, "one request tried");
    assert!(back.not_held.is_empty(), "{back:?}");
    let unread: Vec<Setting> = back
        .unread
        .iter()
        .flat_map(|(s, _)| s.iter().copied())
        .collect();
    assert_eq!(
        unread,
        [Setting::Setpoint, Setting::LeadPump, Setting::Valves]
    );
    let said: Vec<String> = back.unread.iter().map(|(_, e)| e.to_string()).collect();
    let said = said.join("; ");
    assert!(
        said.contains("read back holding 0-0 (supply_setpoint)")
            && said.contains("no answer within 300 ms")
            && said.contains(
                "(holding 10-10 (lead_pump), holding 20-20 (valves_open) not tried after it)"
            ),
        "{said}"
    );
    assert!(back.unread.iter().all(|(_, e)| e.is_unanswered()), "{said}");
}
