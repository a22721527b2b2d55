//! `lwbus watch`: every frame of a site, one line each (or its JSON), and
//! with a reader's sign key the gaps repaired: every 2 s it asks each
//! sender with holes to resend them ([`super::repair`] decides), and
//! prints a resent frame that fills a hole marked ` (resent)`.
//!
//! Glossary:
//! - *reader key*: a sign key of an operator or a facility reader, listed
//!   in the nodes' keyrings with `may = ["resend"]`.

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use loopwarden_bus::keys::SignKey;
use loopwarden_bus::tls::Tls;
use loopwarden_bus::{now_ms, resend, site_filter, Brokers, Bus, BusConfig, Inbound};
use loopwarden_protocol::{Ident, NodeId, Role, Topic};

use super::repair::{Repair, Verdict};
use super::{summary, utc};

/// How often the senders with holes are asked.
const ASK_EVERY: Duration = Duration::from_secs(2);

/// What `lwbus watch` was asked to do.
pub struct Options {
    /// The broker or cluster.
    pub broker: Brokers,
    /// The site.
    pub site: Ident,
    /// One line of JSON per frame.
    pub json: bool,
    /// TLS to the broker.
    pub tls: Option<Tls>,
    /// The reader key, to repair gaps.
    pub key: Option<SignKey>,
}

/// Reads the sign key of `--sign-key` and checks it is a reader's.
pub fn reader_key(path: &Path) -> Result<SignKey> {
    let key = loopwarden_bus::keys::read_sign_key(path).map_err(anyhow::Error::msg)?;
    check_reader(&key).map_err(|e| anyhow::anyhow!("--sign-key {}: {e}", path.display()))?;
    Ok(key)
}

/// A host's or CDU's key asks for nothing: they read no one's events.
fn check_reader(key: &SignKey) -> Result<()> {
    if matches!(key.node.role, Role::Host | Role::Cdu) {
        bail!(
            "the key of {}, a {}: resend requests are signed with a reader's (facility/NAME) \
             or an operator's sign key (`lwbus pki sign-key`)",
            key.node,
            key.node.role.as_str()
        );
    }
    Ok(())
}

/// The line `lwbus watch` prints for a frame, marked when resent. A
/// resent frame reads as it would have on its own topic; its JSON names
/// that topic (`topic`: a command's names the host it is for) and says
/// `"resent":true`.
fn line(msg: &Inbound, json: bool, resent: bool) -> String {
    let frame = &msg.frame;
    let topic = Topic {
        family: match resent {
            true => frame.message.kind().family(),
            false => msg.topic.family,
        },
        ..msg.topic.clone()
    };
    if json {
        let json = frame.to_json();
        let Some(open) = json.strip_suffix('}') else {
            return json;
        };
        let topic = serde_json::Value::String(topic.to_string());
        let resent = if resent { ",\"resent\":true" } else { "" };
        return format!("{open},\"topic\":{topic}{resent}}}");
    }
    format!(
        "{} {:<28} seq {:<8} {:<18} {}{}",
        utc(frame.time.0),
        format!(
            "{}/{}/{}",
            topic.role.as_str(),
            topic.node,
            topic.family.as_str()
        ),
        frame.seq,
        frame.message.kind().name(),
        summary(&frame.message),
        if resent { " (resent)" } else { "" }
    )
}

/// Frames kept for the terminal (the retained frames of 8,000 nodes).
const INBOUND_CAPACITY: usize = 16_384;

/// The brokers as they are reached: one given without a port is on 8883
/// with TLS, 1883 without ([`Brokers::with_tls`]), and said so.
fn reached(o: &Options) -> Brokers {
    o.broker.clone().with_tls(o.tls.is_some())
}

fn start(o: &Options) -> Result<(Bus, tokio::sync::mpsc::Receiver<Inbound>)> {
    let node = match &o.key {
        Some(k) => k.node.clone(),
        None => NodeId::new(Role::Operator, "lwbus-watch")?,
    };
    let mut config = BusConfig::new(reached(o), o.site.clone(), node);
    config.tls = o.tls.clone();
    config.client_id = crate::client_id("watch");
    config.subscriptions.push(site_filter(&o.site));
    // The broker sends every retained frame of the site at once (each
    // node's presence and health) and a terminal prints slower than the
    // client decodes: what waits for the terminal is kept, not dropped.
    config.inbound_capacity = INBOUND_CAPACITY;
    let (bus, inbound, _task) = Bus::start(config);
    Ok((bus, inbound))
}

/// Asks every sender whose holes are due; says why a request did not go.
fn ask(bus: &Bus, key: &SignKey, repair: &mut Repair) {
    for (sender, from, to) in repair.due(now_ms()) {
        if let Err(e) = resend::request(bus, key, sender.role, &sender.id, from, to) {
            eprintln!("lwbus: request to {sender} to resend {from}..={to} not sent: {e}");
        }
    }
}

/// Writes `msg` to `out` as `repair` (if any) decides.
fn show(
    msg: &Inbound,
    json: bool,
    repair: Option<&mut Repair>,
    out: &mut impl Write,
) -> std::io::Result<()> {
    let verdict = repair.map_or(Verdict::Print, |r| {
        let v = r.hear(&msg.topic, &msg.frame);
        match v {
            Verdict::Refused(code) => eprintln!("{}", r.refusal(&msg.frame.sender, code)),
            Verdict::NotOwner => eprintln!("{}", Repair::not_owner(&msg.topic, &msg.frame)),
            _ => {}
        }
        v
    });
    match verdict {
        Verdict::Again | Verdict::NotOwner => Ok(()),
        Verdict::Repaired => writeln!(out, "{}", line(msg, json, true)),
        Verdict::Print | Verdict::Refused(_) => writeln!(out, "{}", line(msg, json, false)),
    }
}

/// Refuses a certificate not made out to the reader or operator whose
/// sign key repairs the gaps: the broker would take the watch for another
/// user, whose ACL may not ask for resends. Without `--sign-key` the
/// watch does not know whose it should be, and takes it as it is.
fn check_identity(o: &Options) -> Result<()> {
    let (Some(tls), Some(key)) = (&o.tls, &o.key) else {
        return Ok(());
    };
    let role = match key.node.role {
        Role::Facility => "facility reader",
        role => role.as_str(),
    };
    (tls.check_identity(role, key.node.id.as_str())).map_err(|e| anyhow::anyhow!("--tls-cert: {e}"))
}

/// Watches until Ctrl-C, repairing gaps when `o.key` is given.
pub async fn run(o: Options) -> Result<()> {
    check_identity(&o)?;
    let (bus, mut inbound) = start(&o)?;
    match &o.key {
        Some(k) => eprintln!("lwbus: frames missed are asked for again as {}", k.node),
        None => eprintln!("lwbus: gaps are not repaired without --sign-key (a reader's key)"),
    }
    if !bus.wait_connected(Duration::from_secs(10)).await {
        eprintln!("lwbus: not connected to {} yet; still trying", reached(&o));
    }
    eprintln!(
        "lwbus: watching site {} on {} (Ctrl-C to stop)",
        o.site,
        reached(&o)
    );
    let mut repair = o.key.as_ref().map(|k| Repair::new(k.node.clone()));
    let mut dropped = 0;
    let mut tick = tokio::time::interval(ASK_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // One listener for the whole watch, polled first on every pass: a
    // Ctrl-C that comes while a line is being written is kept for the
    // next pass, not lost with a listener made anew each time.
    let interrupted = tokio::signal::ctrl_c();
    tokio::pin!(interrupted);
    loop {
        tokio::select! {
            biased;
            r = &mut interrupted => {
                r.context("listening for Ctrl-C")?;
                break;
            }
            _ = tick.tick() => {
                if let (Some(k), Some(r)) = (&o.key, repair.as_mut()) {
                    ask(&bus, k, r);
                }
                dropped = say_dropped(&bus, dropped);
            }
            msg = inbound.recv() => {
                let Some(msg) = msg else { break };
                match show(&msg, o.json, repair.as_mut(), &mut std::io::stdout().lock()) {
                    Ok(()) => {}
                    // The reader stopped (`| head`): the watch is over.
                    Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => break,
                    Err(e) => return Err(e).context("writing to standard output"),
                }
            }
        }
    }
    if let Some(r) = repair.filter(|r| r.repaired() > 0) {
        eprintln!("lwbus: {} frames repaired by resends", r.repaired());
    }
    say_counters(&bus);
    Ok(())
}

/// Says, as it happens, that frames were dropped since `before` (the
/// count then) because the terminal took them slower than they came;
/// gives the count now.
fn say_dropped(bus: &Bus, before: u64) -> u64 {
    let now = bus.metrics().dropped_inbound_full;
    if now > before {
        eprintln!("{}", dropped_line(now - before, now));
    }
    now
}

fn dropped_line(new: u64, total: u64) -> String {
    format!(
        "lwbus: {new} frames not shown ({total} in all): they came faster than this terminal took          them ({INBOUND_CAPACITY} kept waiting); narrow the watch or send it to a file"
    )
}

fn say_counters(bus: &Bus) {
    let m = bus.metrics();
    if m.dropped()
        + m.rejected_bad_crc
        + m.rejected_malformed
        + m.rejected_version
        + m.rejected_unknown_kind
        > 0
    {
        eprintln!("lwbus: counters at exit:\n{m}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use loopwarden_protocol::auth::SigningKey;
    use loopwarden_protocol::{samples, Family, Frame, MessageKind, Topic};

    fn key(role: Role) -> SignKey {
        SignKey {
            node: NodeId::new(role, "k1").unwrap(),
            key_id: 1,
            key: SigningKey::from_bytes(&[3; 32]),
        }
    }

    /// A reader's sign key with another reader's certificate is refused,
    /// naming both; without a sign key nothing says whose it should be.
    #[test]
    fn a_certificate_not_of_the_sign_keys_reader_is_refused() {
        use loopwarden_bus::tls::{Tls, TlsFiles};
        let dir = tempfile::tempdir().unwrap();
        let pki = dir.path().join("pki");
        loopwarden_bus::pki::init(&loopwarden_bus::pki::InitArgs {
            site: "lab".into(),
            hosts: vec!["h01".into()],
            cdus: vec!["cdu1".into()],
            operators: Vec::new(),
            readers: vec!["bms1".into(), "bms2".into()],
            out: pki.clone(),
            broker_port: 8883,
        })
        .unwrap();
        let options = |cert: &str, key: Option<&str>| Options {
            broker: "b.hall".parse().unwrap(),
            site: Ident::new("lab").unwrap(),
            json: false,
            tls: Some(Tls::load(TlsFiles::of_identity(&pki, cert)).unwrap()),
            key: key.map(|k| reader_key(&pki.join(format!("{k}.sign.key"))).unwrap()),
        };
        let e = check_identity(&options("bms2", Some("bms1")))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("bms2.crt is made out to CN \"bms2\"")
                && e.contains("this node is facility reader \"bms1\""),
            "{e}"
        );
        assert!(check_identity(&options("bms1", Some("bms1"))).is_ok());
        assert!(check_identity(&options("bms2", None)).is_ok());
        // The broker, given without a port, is reached and named on 8883.
        assert_eq!(reached(&options("bms1", None)).to_string(), "b.hall:8883");
        let plain = Options {
            tls: None,
            ..options("bms1", None)
        };
        assert_eq!(reached(&plain).to_string(), "b.hall:1883");
    }

    #[test]
    fn a_hosts_or_cdus_key_is_refused_with_the_reason() {
        assert!(check_reader(&key(Role::Facility)).is_ok());
        assert!(check_reader(&key(Role::Operator)).is_ok());
        for role in [Role::Host, Role::Cdu] {
            let e = check_reader(&key(role)).unwrap_err().to_string();
            assert!(e.contains("a reader's (facility/NAME)"), "{e}");
            assert!(
                e.starts_with(&format!("the key of {}/k1", role.as_str())),
                "{e}"
            );
        }
    }

    #[test]
    fn a_resent_frame_is_marked_in_words_and_in_json() {
        let frame: Frame = samples::frame(MessageKind::Event);
        let site = Ident::new("lab").unwrap();
        let topic = Topic::new(&site, Role::Host, &frame.sender.id, Family::Resent);
        let msg = Inbound { topic, frame };
        let text = line(&msg, false, true);
        assert!(text.ends_with(" (resent)"), "{text}");
        assert!(text.contains(" host/h07/event "), "its own topic: {text}");
        assert!(!line(&msg, false, false).contains("resent)"));
        let v: serde_json::Value = serde_json::from_str(&line(&msg, true, true)).unwrap();
        assert_eq!(v["resent"], true);
        assert_eq!(v["kind"], "event");
        let v: serde_json::Value = serde_json::from_str(&line(&msg, true, false)).unwrap();
        assert!(v.get("resent").is_none());
    }

    #[test]
    fn a_json_line_names_its_topic_so_a_command_names_its_host() {
        let site = Ident::new("lab").unwrap();
        for kind in [MessageKind::QuarantineRelease, MessageKind::CapLease] {
            let frame: Frame = samples::frame(kind);
            let h12 = Ident::new("h12").unwrap();
            let topic = Topic::new(&site, Role::Host, &h12, Family::Cmd);
            let msg = Inbound { topic, frame };
            let v: serde_json::Value = serde_json::from_str(&line(&msg, true, false)).unwrap();
            assert_eq!(v["topic"], msg.topic.to_string(), "{v}");
            assert!(
                v["topic"].as_str().unwrap().contains("/host/h12/cmd"),
                "{v}"
            );
            assert_eq!(v["kind"], kind.name());
        }
        // A resent frame: the topic it would have come on.
        let frame: Frame = samples::frame(MessageKind::Event);
        let resent = Topic::new(&site, Role::Host, &frame.sender.id, Family::Resent);
        let msg = Inbound {
            topic: resent,
            frame,
        };
        let v: serde_json::Value = serde_json::from_str(&line(&msg, true, true)).unwrap();
        let own = Topic::new(&site, Role::Host, &msg.frame.sender.id, Family::Event);
        assert_eq!(v["topic"], own.to_string());
        assert_eq!(v["resent"], true);
    }

    /// A writer whose reader has gone.
    struct Closed;

    impl Write for Closed {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::ErrorKind::BrokenPipe.into())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_closed_output_is_an_error_to_stop_on_not_a_panic() {
        let frame: Frame = samples::frame(MessageKind::Event);
        let site = Ident::new("lab").unwrap();
        let topic = Topic::new(&site, Role::Host, &frame.sender.id, Family::Event);
        let msg = Inbound { topic, frame };
        let e = show(&msg, false, None, &mut Closed).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe);
        let mut out = Vec::new();
        show(&msg, true, None, &mut out).unwrap();
        assert!(String::from_utf8(out).unwrap().ends_with("}\n"));
    }
}
