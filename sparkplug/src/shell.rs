//! The bridge's I/O: the Loopwarden bus in (through `loopwarden-bus`, as
//! `lwbus watch` reads it), Sparkplug B out (a `rumqttc` client of its
//! own, with the NDEATH as its will), a tick, and the stop signals. Every
//! decision is the core's ([`crate::bridge`]); this file moves bytes, and
//! discards the Loopwarden frames still queued when the bus client says
//! it dropped some (they are older than the frames lost).
//!
//! The Sparkplug client's event loop runs in a task of its own: it tells
//! the main loop what happened (`SparkplugEvent`) and, after a lost
//! connection, waits for the options of the next attempt (the next
//! broker, the next will) before it reconnects, after the backoff.
//!
//! Glossary:
//! - *link*: where and how the Sparkplug client connects (brokers, TLS,
//!   credentials, keep-alive, client id).

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use loopwarden_bus::tls::Tls;
use loopwarden_bus::{now_ms, Backoff, Brokers, Bus, BusConfig, BusTask};
use loopwarden_protocol::topic::filter;
use loopwarden_protocol::{Family, Ident, NodeId, Role};
use rand::SeedableRng;
use rumqttc::{AsyncClient, Event, EventLoop, LastWill, MqttOptions, Outgoing, Packet, QoS};
use tokio::sync::mpsc;
use tracing::{error, info, warn};

use crate::bridge::{Bridge, BridgeConfig, Input, Kind, Notice, Now, Publish, REBIRTH_EVERY_MS};

mod log_limit;
use log_limit::{warn_fields, Allow, LogLimit, LOG_SOURCES};

/// The least number of requests the Sparkplug client queues before it
/// refuses more; more for a site whose round of births is larger.
const QUEUE: usize = 4096;

/// The Sparkplug client's queue for a site of `max_devices`: a whole
/// round of births (an NBIRTH and a DBIRTH or DDEATH per device) and as
/// much again for the data that follows it.
pub fn queue_for(max_devices: usize) -> usize {
    QUEUE.max(max_devices.saturating_add(1).saturating_mul(2))
}

/// Now on both clocks: the wall clock for the timestamps published, and
/// the monotonic one (ms since the bridge first asked) for every window
/// and silence, which an NTP step or a resumed VM must not move.
fn now() -> Now {
    static START: OnceLock<Instant> = OnceLock::new();
    let start = *START.get_or_init(Instant::now);
    let mono = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
    Now {
        wall: now_ms().0,
        mono,
    }
}

/// Where and how the Sparkplug client connects.
#[derive(Debug, Clone)]
pub struct Link {
    /// The brokers, tried in order, each on its port (one given without
    /// a port is put on 8883 with TLS, 1883 without, when the options
    /// are read: [`Brokers::with_tls`]).
    pub brokers: Brokers,
    /// TLS, if any.
    pub tls: Option<Tls>,
    /// User name and password, if the broker wants them.
    pub credentials: Option<(String, String)>,
    /// MQTT keep-alive: the broker publishes the NDEATH 1.5 × this after
    /// the bridge falls silent.
    pub keep_alive: Duration,
    /// The MQTT client id.
    pub client_id: String,
}

/// Everything the bridge needs to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// The Loopwarden broker(s).
    pub loopwarden: Brokers,
    /// TLS to the Loopwarden broker.
    pub loopwarden_tls: Option<Tls>,
    /// The site to bridge.
    pub site: Ident,
    /// The Sparkplug side.
    pub sparkplug: Link,
    /// The core's settings.
    pub bridge: BridgeConfig,
    /// The most CDUs and hosts the site has: sizes the Sparkplug
    /// client's queue so that a round of births fits.
    pub max_devices: usize,
}

/// What the Sparkplug client's task reports.
#[derive(Debug)]
enum SparkplugEvent {
    /// Connected, and the NCMD subscription answered: refused or not.
    Subscribed {
        /// The broker refused it.
        ncmd_refused: bool,
    },
    /// An NCMD payload, and whether the broker kept it retained.
    Command(Vec<u8>, bool),
    /// A QoS 1 publish was acknowledged (the NDEATH at stop).
    Acked,
    /// The connection failed or was lost: send the next attempt's options.
    Lost(String),
    /// The DISCONNECT went out: the task has ended.
    Disconnected,
}

fn mqtt_options(link: &Link, index: usize, will: &Publish) -> MqttOptions {
    let broker = link.brokers.get(index);
    let mut o = MqttOptions::new(&link.client_id, &broker.host, broker.port);
    o.set_keep_alive(link.keep_alive.max(Duration::from_secs(1)));
    o.set_clean_session(true);
    o.set_max_packet_size(MAX_PACKET, MAX_PACKET);
    if let Some((user, password)) = &link.credentials {
        o.set_credentials(user, password);
    }
    if let Some(tls) = &link.tls {
        o.set_transport(rumqttc::Transport::tls_with_config(
            rumqttc::TlsConfiguration::Rustls(tls.config.clone()),
        ));
    }
    // Sparkplug: the NDEATH will is QoS 1 and not retained.
    o.set_last_will(LastWill::new(
        &will.topic,
        will.payload.clone(),
        QoS::AtLeastOnce,
        false,
    ));
    o
}

/// The largest MQTT packet the Sparkplug client sends or takes, bytes.
const MAX_PACKET: usize = 1 << 20;

/// Why the Sparkplug connection was lost, for the log. A packet past
/// [`MAX_PACKET`] from the broker can only be a publish on NCMD (the one
/// subscription); the client drops the connection on it, and a retained
/// one comes again at every connection, so the line says so and what to
/// do.
fn lost_why(e: &rumqttc::ConnectionError, ncmd: &str) -> String {
    use rumqttc::{ConnectionError, StateError};
    let ConnectionError::MqttState(StateError::Deserialization(
        rumqttc::Error::PayloadSizeLimitExceeded(size),
    )) = e
    else {
        return e.to_string();
    };
    format!(
        "the broker sent a packet whose remaining length is {size} bytes, past the client's \
         {MAX_PACKET}: an NCMD on {ncmd} (its one subscription). Sparkplug NCMDs are small and \
         never retained; if it is retained it comes at every connection and the bridge cannot \
         stay connected: clear it with an empty retained publish, and set the broker's \
         max_packet_size to 1 MiB or less so that it refuses such a publish itself \
         (docs/sparkplug.md section 6) ({e})"
    )
}

/// How long a connection must have lasted for the next attempt to start
/// the backoff afresh.
const LASTED: Duration = Duration::from_secs(10);

/// Drives the Sparkplug client's event loop: reports what happens, and
/// after each lost connection waits for the next attempt's options.
async fn drive_sparkplug(
    mut eventloop: EventLoop,
    client: AsyncClient,
    ncmd: String,
    events: mpsc::Sender<SparkplugEvent>,
    mut next_options: mpsc::Receiver<MqttOptions>,
) {
    let mut backoff = Backoff::default();
    let mut rng = rand::rngs::StdRng::from_entropy();
    let mut connected_at: Option<std::time::Instant> = None;
    loop {
        let event = match eventloop.poll().await {
            Ok(Event::Incoming(Packet::ConnAck(_))) => {
                connected_at = Some(std::time::Instant::now());
                if let Err(e) = client.try_subscribe(&ncmd, QoS::AtLeastOnce) {
                    warn!(error = %e, "cannot subscribe to NCMD");
                }
                continue;
            }
            Ok(Event::Incoming(Packet::SubAck(ack))) => SparkplugEvent::Subscribed {
                ncmd_refused: (ack.return_codes).contains(&rumqttc::SubscribeReasonCode::Failure),
            },
            Ok(Event::Incoming(Packet::Publish(p))) if p.topic == ncmd => {
                SparkplugEvent::Command(p.payload.to_vec(), p.retain)
            }
            Ok(Event::Incoming(Packet::PubAck(_))) => SparkplugEvent::Acked,
            Ok(Event::Outgoing(Outgoing::Disconnect)) => {
                let _ = events.send(SparkplugEvent::Disconnected).await;
                return;
            }
            Ok(_) => continue,
            Err(e) => {
                if events
                    .send(SparkplugEvent::Lost(lost_why(&e, &ncmd)))
                    .await
                    .is_err()
                {
                    return;
                }
                let Some(options) = next_options.recv().await else {
                    return;
                };
                // The old session's requests, and those queued since it
                // broke, belong to it: the next session is clean and starts
                // with its births, which the core publishes again.
                eventloop.clean();
                eventloop.pending.clear();
                eventloop.mqtt_options = options;
                // Only a connection that lasted resets the backoff: a
                // broker that accepts, then drops the bridge (another
                // bridge with its edge node id, an ACL that disconnects)
                // is not tried four times a second, with births each time.
                if connected_at.take().is_some_and(|t| t.elapsed() > LASTED) {
                    backoff.reset();
                }
                tokio::time::sleep(backoff.next_wait(&mut rng)).await;
                continue;
            }
        };
        if events.send(event).await.is_err() {
            return;
        }
    }
}

/// Logs what the core noticed, refusals at most once a minute per source
/// (`now` monotonic), and the refused fields held back whose minute has
/// ended (the main loop calls this at every tick too).
fn log_notices(core: &mut Bridge, limit: &mut LogLimit, now: u64) {
    for notice in core.take_notices() {
        match notice {
            Notice::RebirthsLimited { in_ms, total } => warn!(
                in_ms,
                held_back = total,
                "rebirth requests come faster than one per {} s: the births go out once at \
                 the window's end, for every request until then (bridge/rebirths_limited)",
                REBIRTH_EVERY_MS / 1000
            ),
            Notice::EmptyCommand => match limit.allow("NCMD empty".into(), now) {
                Allow::Line(held_back) | Allow::Others(held_back) => info!(
                    held_back,
                    "empty NCMD ignored: the publish that clears a retained NCMD, handed over live"
                ),
                Allow::Held => {}
            },
            Notice::CommandRefused { why } => match limit.allow("NCMD".into(), now) {
                Allow::Line(held_back) | Allow::Others(held_back) => {
                    warn!(%why, held_back, "NCMD refused (bridge/commands_refused)")
                }
                Allow::Held => {}
            },
            Notice::FrameRefused { topic, sender, why } => {
                match limit.allow(format!("{topic} {sender}"), now) {
                    Allow::Line(held_back) => {
                        warn!(%topic, %sender, %why, held_back, "frame refused (bridge/frames_refused)")
                    }
                    Allow::Others(held_back) => warn!(
                        %topic, %sender, %why, held_back, sources = LOG_SOURCES,
                        "frame refused; refusals come from more sources than are logged one by \
                         one: one line a minute for the others, held_back counting them \
                         (bridge/frames_refused)"
                    ),
                    Allow::Held => {}
                }
            }
            Notice::FieldsRefused { device, why } => {
                if let Some(line) = limit.fields(device, why, now) {
                    warn_fields(line);
                }
            }
            Notice::Silent { device, for_ms } => warn!(
                %device,
                silent_s = for_ms / 1000,
                "device unheard past its silence limit: DDEATH until it is heard (bridge/devices_silent)"
            ),
            Notice::InboundDropped { new, total } => warn!(
                new,
                total,
                "the Loopwarden client dropped frames it could not queue: every device dies and \
                 is born again as heard (bridge/frames_dropped_inbound)"
            ),
            Notice::NcmdRefused { topic } => error!(
                %topic,
                "the Sparkplug broker refused the NCMD subscription: this identity may not use \
                 spBv1.0 topics on this broker, so no rebirth request reaches the bridge, and an \
                 ACL that refuses it likely drops its births, data and NDEATH too, unseen \
                 (bridge/ncmd_refused). Give it the rules of docs/sparkplug.md section 6 (a \
                 site's reader certificate has none) or publish on another broker \
                 (--sparkplug-broker)"
            ),
            Notice::NoticesLost { count } => warn!(
                not_logged = count,
                "more notices at once than the bridge keeps for the log: these were not logged \
                 (bridge/devices_silent and bridge/frames_refused count them)"
            ),
        }
    }
    for line in limit.fields_due(now) {
        warn_fields(line);
    }
}

/// Hands the core's publishes to the client; what it cannot take is
/// counted and makes the core send every birth again.
fn send(client: &AsyncClient, core: &mut Bridge, out: Vec<Publish>) {
    let mut dropped = 0;
    // The DDEATHs dropped: a round of births says those deaths again.
    let mut deaths = Vec::new();
    for p in out {
        let qos = if p.qos == 1 {
            QoS::AtLeastOnce
        } else {
            QoS::AtMostOnce
        };
        if client.try_publish(&p.topic, qos, false, p.payload).is_err() {
            dropped += 1;
            if let (Kind::DDeath, Some(device)) = (p.kind, p.device) {
                deaths.push(device);
            }
        }
    }
    if dropped > 0 {
        warn!(
            dropped,
            "Sparkplug client queue full: publishes dropped, births follow (no data until then)"
        );
        // Nothing now: the births go out at the next tick.
        let _ = core.step(
            now(),
            Input::Dropped {
                count: dropped,
                deaths,
            },
        );
    }
}

/// The subscriptions on the Loopwarden bus: presence, health and
/// telemetry of every host and CDU of the site, nothing else. Presence
/// first: the broker sends the retained messages of one subscription in
/// the order of its filters, so a node that is gone is known to be gone
/// before its retained health arrives, and is not born just to die.
fn loopwarden_filters(site: &Ident) -> Result<Vec<String>> {
    let mut filters = Vec::new();
    for family in [Family::Online, Family::Health, Family::Telemetry] {
        for role in [Role::Host, Role::Cdu] {
            let f = filter::family(site, role, family)
                .map_err(|e| anyhow::anyhow!("site {site}: {e:?}"))?;
            filters.push(f.to_string());
        }
    }
    Ok(filters)
}

/// The Loopwarden client's count of frames it could not queue, read at a
/// tick (`seen`: the count read before): the core's publishes, and how
/// many frames still queued were discarded unread.
///
/// When the count rose, every frame still queued was queued before it was
/// read, some before the frames lost (an `online: false`, a health
/// change), and nothing tells which: the senders' clocks are not the
/// bridge's, and only the queue's order says what came first. Each is
/// discarded before the core declares every device dead, so that none is
/// born again by a frame older than what was lost, only by its next one.
/// A frame queued after the drop is discarded too: a sample costs a
/// device its next second, but a health frame, sent only on a change and
/// then every 60 rounds, leaves the host's health null until that
/// republish (a quarantine in the window is shown null for up to a
/// minute at the default period, never as healthy); a CDU's state,
/// republished every minute too, likewise.
fn inbound_dropped(
    core: &mut Bridge,
    now: Now,
    total: u64,
    seen: &mut u64,
    queued: &mut mpsc::Receiver<loopwarden_bus::Inbound>,
) -> (Vec<Publish>, u64) {
    let mut discarded = 0;
    if total > *seen {
        *seen = total;
        while queued.try_recv().is_ok() {
            discarded += 1;
        }
    }
    (core.step(now, Input::InboundDropped(total)), discarded)
}

/// The main loop's state around the core: which Sparkplug broker is in
/// use, how to hand the next attempt's options to the client's task, and
/// what the core last heard of the Loopwarden bus.
struct Shell {
    core: Bridge,
    link: Link,
    broker: usize,
    next_options: mpsc::Sender<MqttOptions>,
    loopwarden_up: bool,
    log: LogLimit,
    max_devices: usize,
    /// The site was said larger than `max_devices`.
    too_many_told: bool,
    /// The Loopwarden client's count of frames dropped, as last read.
    dropped_inbound: u64,
}

impl Shell {
    /// Tells the core when the Loopwarden bus went up or down.
    fn loopwarden(&mut self, now: Now, up: bool) -> Vec<Publish> {
        if up == self.loopwarden_up {
            return Vec::new();
        }
        self.loopwarden_up = up;
        info!(connected = up, "Loopwarden bus");
        self.core.step(now, Input::LoopwardenConnected(up))
    }

    async fn on_event(&mut self, event: SparkplugEvent, loopwarden_up: bool) -> Vec<Publish> {
        let now = now();
        match event {
            SparkplugEvent::Subscribed { ncmd_refused } => {
                let broker = self.link.brokers.get(self.broker);
                info!(%broker, bd_seq = ?self.core.bd_seq(), ncmd_refused, "Sparkplug session up: births");
                // The birth says whether the Loopwarden bus is up now, and
                // whether the NCMD subscription was refused.
                let mut out = self.loopwarden(now, loopwarden_up);
                if ncmd_refused {
                    out.extend(self.core.step(now, Input::NcmdRefused));
                }
                out.extend(self.core.step(now, Input::Connected));
                out
            }
            SparkplugEvent::Command(bytes, false) => self.core.step(now, Input::Command(bytes)),
            SparkplugEvent::Command(bytes, true) => {
                self.core.step(now, Input::RetainedCommand(bytes))
            }
            SparkplugEvent::Acked | SparkplugEvent::Disconnected => Vec::new(),
            SparkplugEvent::Lost(why) => {
                let broker = self.link.brokers.get(self.broker);
                if self.core.in_session() {
                    warn!(error = %why, %broker, "Sparkplug connection lost");
                } else {
                    warn!(error = %why, %broker, "cannot connect to the Sparkplug broker");
                }
                self.core.step(now, Input::ConnectionLost);
                self.broker = self.link.brokers.after(self.broker);
                let will = self.core.connecting(now.wall);
                let options = mqtt_options(&self.link, self.broker, &will);
                let _ = self.next_options.send(options).await;
                Vec::new()
            }
        }
    }

    fn on_tick(
        &mut self,
        loopwarden_up: bool,
        dropped_inbound: u64,
        queued: &mut mpsc::Receiver<loopwarden_bus::Inbound>,
    ) -> Vec<Publish> {
        let now = now();
        let mut out = self.loopwarden(now, loopwarden_up);
        let seen = &mut self.dropped_inbound;
        let (dead, discarded) = inbound_dropped(&mut self.core, now, dropped_inbound, seen, queued);
        if discarded > 0 {
            warn!(
                discarded,
                "frames still queued when the Loopwarden client dropped others discarded unread: \
                 older than what was lost, they would show stale values"
            );
        }
        out.extend(dead);
        out.extend(self.core.step(now, Input::Tick));
        let devices = self.core.devices();
        if devices > self.max_devices && !self.too_many_told {
            self.too_many_told = true;
            warn!(
                devices,
                max_devices = self.max_devices,
                "the site has more CDUs and hosts than --max-devices: a round of births may not \
                 fit the Sparkplug client's queue; restart with a larger --max-devices"
            );
        }
        out
    }
}

/// Starts the Loopwarden side: a reader of the site's frames.
fn start_loopwarden(
    brokers: Brokers,
    tls: Option<Tls>,
    site: &Ident,
) -> Result<(Bus, mpsc::Receiver<loopwarden_bus::Inbound>, BusTask)> {
    let node = NodeId::new(Role::Facility, "lw-sparkplug").context("bridge node id")?;
    let mut config = BusConfig::new(brokers, site.clone(), node);
    config.tls = tls;
    config.client_id = format!("lw-sparkplug-{site}-{}", std::process::id());
    config.inbound_capacity = 4096;
    config.subscriptions = loopwarden_filters(site)?;
    Ok(Bus::start(config))
}

/// Runs the bridge until Ctrl-C or SIGTERM, then leaves cleanly: the
/// NDEATH, a disconnect, and the Loopwarden bus closed.
pub async fn run(options: Options) -> Result<()> {
    let Options {
        loopwarden,
        loopwarden_tls,
        site,
        sparkplug: link,
        bridge,
        max_devices,
    } = options;
    let ncmd = bridge.ncmd_topic();
    let (bus, mut inbound, bus_task) = start_loopwarden(loopwarden.clone(), loopwarden_tls, &site)?;
    let mut core = Bridge::new(bridge);
    let will = core.connecting(now().wall);
    let (client, eventloop) =
        AsyncClient::new(mqtt_options(&link, 0, &will), queue_for(max_devices));
    let (event_tx, mut events) = mpsc::channel(64);
    let (options_tx, options_rx) = mpsc::channel(1);
    let mut driver = tokio::spawn(drive_sparkplug(
        eventloop,
        client.clone(),
        ncmd,
        event_tx,
        options_rx,
    ));
    info!(loopwarden = %loopwarden, sparkplug = %link.brokers, %site, "bridging");
    let mut shell = Shell {
        core,
        link,
        broker: 0,
        next_options: options_tx,
        loopwarden_up: false,
        log: LogLimit::default(),
        max_devices,
        too_many_told: false,
        dropped_inbound: 0,
    };
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("SIGTERM handler")?;
    loop {
        let out = tokio::select! {
            event = events.recv() => {
                let Some(event) = event else { bail!("the Sparkplug client stopped") };
                shell.on_event(event, bus.is_connected()).await
            }
            msg = inbound.recv() => {
                let Some(m) = msg else { bail!("the Loopwarden bus stopped") };
                // Frames the bus took before it went down may come after:
                // the core hears of the loss first, and ignores them.
                let now = now();
                let mut out = shell.loopwarden(now, bus.is_connected());
                out.extend(shell.core.step(now, Input::Frame(m.topic, m.frame)));
                out
            }
            _ = tick.tick() => {
                let dropped = bus.metrics().dropped_inbound_full;
                shell.on_tick(bus.is_connected(), dropped, &mut inbound)
            }
            _ = tokio::signal::ctrl_c() => break,
            _ = terminate.recv() => break,
        };
        log_notices(&mut shell.core, &mut shell.log, now().mono);
        send(&client, &mut shell.core, out);
    }
    stop(&client, &mut shell.core, &mut events).await;
    // A client between two attempts waits for options that never come.
    drop(shell);
    if tokio::time::timeout(Duration::from_secs(2), &mut driver)
        .await
        .is_err()
    {
        driver.abort();
    }
    let _ = bus.shutdown(Duration::from_secs(2)).await;
    bus_task.join(Duration::from_secs(2)).await;
    info!("stopped");
    Ok(())
}

/// A clean stop: the NDEATH (QoS 1, acknowledged or 3 s), then a
/// DISCONNECT, so the broker drops the will.
async fn stop(
    client: &AsyncClient,
    core: &mut Bridge,
    events: &mut mpsc::Receiver<SparkplugEvent>,
) {
    let out = core.step(now(), Input::Stop);
    let said_goodbye = !out.is_empty();
    send(client, core, out);
    let wait = async {
        if said_goodbye {
            while let Some(e) = events.recv().await {
                if matches!(e, SparkplugEvent::Acked) {
                    break;
                }
            }
        }
        let _ = client.try_disconnect();
        while let Some(e) = events.recv().await {
            if matches!(e, SparkplugEvent::Disconnected) {
                break;
            }
        }
    };
    if tokio::time::timeout(Duration::from_secs(3), wait)
        .await
        .is_err()
    {
        warn!("the Sparkplug broker did not take the goodbye in 3 s");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_lost_to_an_oversized_ncmd_names_the_topic_and_the_cure() {
        use rumqttc::{ConnectionError, StateError};
        let ncmd = "spBv1.0/hall-1/NCMD/loopwarden";
        let too_large = rumqttc::Error::PayloadSizeLimitExceeded(MAX_PACKET + 1);
        let e = ConnectionError::MqttState(StateError::Deserialization(too_large));
        let why = lost_why(&e, ncmd);
        let size = format!("remaining length is {} bytes", MAX_PACKET + 1);
        assert!(why.contains(&size), "{why}");
        assert!(why.contains("max_packet_size to 1 MiB or less"), "{why}");
        assert!(why.contains(ncmd), "{why}");
        assert!(why.contains("empty retained publish"), "{why}");
        // Any other loss is said as the client says it.
        let other = ConnectionError::NetworkTimeout;
        assert_eq!(lost_why(&other, ncmd), other.to_string());
    }

    fn h07(temp: u8) -> loopwarden_bus::Inbound {
        use loopwarden_protocol::{samples, Frame, Message, TimestampMs, Topic, WholeCelsius};
        let site = Ident::new("hall-1").unwrap();
        let node = NodeId::new(Role::Host, "h07").unwrap();
        let topic = Topic::new(&site, Role::Host, &node.id, Family::Telemetry);
        let mut t = samples::host_telemetry(2);
        t.gpus[0].temp = WholeCelsius(temp);
        let frame = Frame {
            sender: node,
            seq: 1,
            time: TimestampMs(T),
            message: Message::HostTelemetry(t),
        };
        loopwarden_bus::Inbound { topic, frame }
    }

    const T: u64 = 1_795_953_600_000;

    /// What the main loop does with the frames queued: each to the core.
    fn deliver(
        core: &mut Bridge,
        queued: &mut mpsc::Receiver<loopwarden_bus::Inbound>,
    ) -> Vec<crate::bridge::Kind> {
        let mut out = Vec::new();
        while let Ok(m) = queued.try_recv() {
            out.extend(core.step(T, Input::Frame(m.topic, m.frame)));
        }
        out.iter().map(|p| p.kind).collect()
    }

    /// h07's sample at `now`, its GPUs `bad` drawing past any GPU's.
    fn h07_drawing(bad: &[usize], now: u64) -> Input {
        use loopwarden_protocol::{samples, Frame, Message, TimestampMs, Topic, Watts};
        let site = Ident::new("hall-1").unwrap();
        let node = NodeId::new(Role::Host, "h07").unwrap();
        let topic = Topic::new(&site, Role::Host, &node.id, Family::Telemetry);
        let mut t = samples::host_telemetry(8);
        for &g in bad {
            t.gpus[g].power = Watts(200_000);
        }
        let frame = Frame {
            sender: node,
            seq: 1,
            time: TimestampMs(now),
            message: Message::HostTelemetry(t),
        };
        Input::Frame(topic, frame)
    }

    #[test]
    fn refused_fields_that_change_within_the_minute_are_logged_when_it_ends() {
        let mut core = core();
        core.connecting(T);
        core.step(T, Input::Connected);
        let mut log = LogLimit::default();
        let mut lines = Vec::new();
        // GPU 3's power bad from T, GPU 5's too from T + 5 s, for 2 min.
        for s in 0..=120u64 {
            let now = T + s * 1_000;
            let bad: &[usize] = if s < 5 { &[3] } else { &[3, 5] };
            core.step(now, h07_drawing(bad, now));
            core.step(now, Input::Tick);
            // What log_notices does with them.
            for notice in core.take_notices() {
                if let Notice::FieldsRefused { device, why } = notice {
                    lines.extend(log.fields(device, why, now));
                }
            }
            lines.extend(log.fields_due(now));
        }
        let said: Vec<_> = lines
            .iter()
            .map(|l| (l.device.as_str(), l.why.as_str()))
            .collect();
        assert_eq!(lines.len(), 2, "{said:?}");
        assert!(said[0].1.contains("gpu 3 power 200000 W"), "{said:?}");
        assert!(!said[0].1.contains("gpu 5"), "{said:?}");
        assert_eq!(said[1].0, "h07");
        assert!(said[1].1.contains("gpu 5 power 200000 W"), "{said:?}");
        // At the minute's end, saying when it came.
        assert_eq!((lines[1].noticed_ms_ago, lines[1].held_back), (55_000, 0));
    }

    fn core() -> Bridge {
        Bridge::new(BridgeConfig {
            group: "hall-1".into(),
            edge_node: "loopwarden".into(),
            site: "hall-1".into(),
            software: "0.1.0".into(),
            ndata_every_ms: 10_000,
            host_silent_after_ms: 10_000,
            cdu_silent_after_ms: 10_000,
            max_devices: 2_000,
        })
    }

    #[test]
    fn frames_queued_before_a_drop_birth_nothing_and_the_next_one_births_the_device() {
        use crate::bridge::Kind;
        let mut core = core();
        core.connecting(T);
        core.step(T, Input::Connected);
        let (tx, mut queued) = mpsc::channel(8);
        tx.try_send(h07(61)).unwrap();
        assert_eq!(deliver(&mut core, &mut queued), [Kind::DBirth]);
        // An older sample still queued when h07's `online: false` was
        // dropped (the queue full), and the count read at the next tick.
        tx.try_send(h07(62)).unwrap();
        let mut seen = 0;
        let (out, discarded) = inbound_dropped(&mut core, T.into(), 1, &mut seen, &mut queued);
        assert_eq!(
            out.iter().map(|p| p.kind).collect::<Vec<_>>(),
            [Kind::DDeath]
        );
        assert_eq!(deliver(&mut core, &mut queued), [], "no stale birth");
        assert_eq!((discarded, seen), (1, 1));
        // Its next frame, taken after the drop, births it again.
        tx.try_send(h07(63)).unwrap();
        assert_eq!(deliver(&mut core, &mut queued), [Kind::DBirth]);
        // The same count at the next tick discards nothing.
        tx.try_send(h07(64)).unwrap();
        let (out, discarded) = inbound_dropped(&mut core, T.into(), 1, &mut seen, &mut queued);
        assert_eq!((out.len(), discarded), (0, 0));
        assert_eq!(deliver(&mut core, &mut queued), [Kind::DData]);
    }

    #[test]
    fn the_queue_holds_a_round_of_births() {
        assert_eq!(queue_for(100), QUEUE);
        assert_eq!(queue_for(5_000), 10_002);
    }
}
