//! What the shell does once, at start: the bus's configuration (its
//! subscriptions, every host's command topic checked to build), the
//! board's ropes checked against the layout, the decision path built from
//! the latched record in flash, what the core learned and the limits the
//! BMS set restored, and the resender that answers readers' requests for
//! logged events.
use super::*;
use cooling_core::config::Layout;
use cooling_core::estimate::record::HostIds;
use cooling_core::Learned;

/// The bus of `cfg`'s CDU as `opts` says (its login taken from it), and
/// the CDU's node on it: its frames numbered from `first_seq` (the block
/// reserved in flash), its own hosts' telemetry and every host's acks
/// subscribed, and with `facility` the hall's other CDUs' states; every
/// host's command topic checked to build.
pub(crate) fn bus_config(
    cfg: &ShellConfig,
    opts: &mut BusOptions,
    first_seq: u32,
    facility: bool,
) -> Result<(NodeId, BusConfig), ShellError> {
    let me = NodeId::new(Role::Cdu, cfg.cdu.as_str())
        .map_err(|e| ShellError::Config(format!("cdu: {e}")))?;
    let mut bus_config = BusConfig::new(cfg.broker.clone(), cfg.site.clone(), me.clone());
    bus_config.first_seq = first_seq;
    bus_config.credentials = opts.credentials.take();
    if let Some(k) = opts.keep_alive {
        bus_config.keep_alive = k;
    }
    if let Some(j) = opts.json_presence {
        bus_config.json_presence = j;
    }
    bus_config.tls = cfg.tls.clone();
    // In a second a CDU hears each of its hosts' telemetry, and in a cap
    // episode an ack from each, all at about the same instant; and it
    // sends each a lease with its JSON mirror: room for a few seconds of
    // that, so a step that runs late drops none of it.
    let per_host = 4 * cfg.hosts.len();
    bus_config.inbound_capacity = bus_config.inbound_capacity.max(per_host);
    bus_config.queue_capacity = bus_config.queue_capacity.max(per_host);
    let acks = filter::family(&cfg.site, Role::Host, Family::Ack)
        .map_err(|e| ShellError::Bus(format!("the host ack filter: {e:?}")))?;
    bus_config.subscriptions.push(acks.to_string());
    let topic = |h: &Ident, family: Family| {
        Topic::new(&cfg.site, Role::Host, h, family)
            .build()
            .map_err(|e| ShellError::Bus(format!("the {family:?} topic of host {h}: {e:?}")))
    };
    for h in &cfg.hosts {
        bus_config
            .subscriptions
            .push(topic(h, Family::Telemetry)?.to_string());
        // Every command topic must build before anything runs.
        topic(h, Family::Cmd)?;
    }
    if facility {
        // The other CDUs' states: the coordinator's plan, their offers.
        bus_config.subscriptions.push(hall_subscription(&cfg.site)?);
    }
    Ok((me, bus_config))
}

/// Every rack of the layout has a rope on the board (`roped`; `None`: no
/// board pins), or is declared unprotected; the racks without one are
/// said in the log ([`leak_sensing_notes`]).
pub(super) fn check_ropes(core: &CoreConfig, roped: Option<u16>) -> Result<(), ShellError> {
    let l = core.layout;
    for note in leak_sensing_notes(&l, roped.is_some()) {
        tracing::warn!("cooling shell: {note}");
    }
    let Some(roped) = roped else {
        return Ok(());
    };
    let bare = (0..l.racks.min(16)).find(|r| (roped | l.unprotected) & (1 << r) == 0);
    match bare {
        Some(r) => Err(ShellError::Config(format!(
            "rack {r} has no leak rope in the board's pin map: give it one, or declare it in unprotected_racks to run it without leak sensing"
        ))),
        None => Ok(()),
    }
}

/// What the log says at every start of the racks of `l` that have no
/// leak rope: those declared unprotected, and every rack when no board
/// pins are configured (`board`: they are).
pub(super) fn leak_sensing_notes(l: &Layout, board: bool) -> Vec<String> {
    let mut notes = Vec::new();
    if !board {
        notes.push(
            "no board pins (board_pins, gpio_chip): no leak rope is read; leaks come from the CDU's leak register only, and while it does not answer leak sensing is lost on every rack"
                .to_string(),
        );
    }
    let bare: Vec<String> = (0..l.racks.min(16))
        .filter(|r| l.unprotected & (1 << r) != 0)
        .map(|r| r.to_string())
        .collect();
    if !bare.is_empty() {
        notes.push(format!(
            "racks {} have no leak rope (unprotected_racks): a leak there is seen only by the CDU's own leak input, if it has one",
            bare.join(", ")
        ));
    }
    notes
}

/// The decision path at start, on a CDU of map `limits`: the core
/// restored from the latched record in flash, a fresh one when none was
/// kept, and when the record cannot be read a fresh one that keeps the
/// record and latches the racks whose valves the CDU reports closed
/// ([`crate::decide::latch`]); the records written then go above
/// `floor`, the generation the flash held beside the record it could not
/// read ([`crate::journal::relatch_floor`]). Says in the log what it
/// restored, and where the map holds the core tighter than its
/// configuration.
pub(crate) fn start_decider(
    cfg: CoreConfig,
    limits: MapLimits,
    latched: &Result<Option<LatchRecord>, String>,
    floor: Option<u32>,
) -> Result<Decider, ShellError> {
    if let Ok(Some(r)) = latched {
        let l = &r.latched;
        let restored = loopwarden_protocol::Event::ControllerRestored {
            leaks_latched: l.leaks,
            pumps_out: l.pumps_out(),
            lead: l.lead,
        };
        let failsafe = match l.failsafe {
            Some(r) => format!("; in failsafe ({r})"),
            None => String::new(),
        };
        tracing::warn!(
            "cooling shell: {restored}{failsafe} (latched record generation {})",
            r.generation
        );
    }
    let mut d = Decider::new(cfg, limits, latched).map_err(ShellError::Core)?;
    if let Some(g) = floor {
        d.continue_above(g);
    }
    log_said(&mut d);
    Ok(d)
}

/// Logs what the decision path has to say.
pub(super) fn log_said(d: &mut Decider) {
    for what in d.take_said() {
        if what.error() {
            tracing::error!("cooling shell: {what}");
        } else {
            tracing::warn!("cooling shell: {what}");
        }
    }
}

/// Restores into `core` what an earlier run learned, as the flash held it
/// (`records`), its hosts known by their ids in `hosts` (the configured
/// list), or by index when none is configured ([`restore_learned_on`]).
pub(super) fn restore_learned(core: &mut Core, records: &LearnedRecords, hosts: &[Ident]) {
    let ids = if hosts.is_empty() {
        Learned::new(core.config()).ids
    } else {
        journal::host_ids(hosts)
    };
    restore_learned_on(core, records, ids);
}

/// Restores into `core` the limits the BMS set before this start, as the
/// flash held them (`read`), and logs them, or why not; gives the limits
/// then in force, for the northbound registers to read.
pub(super) fn restore_bms_limits(
    core: &mut Core,
    read: &Result<Option<(f32, f32)>, String>,
) -> Option<bms::BmsLimits> {
    match read {
        Ok(None) => None,
        Ok(Some((ceiling, offset))) => {
            core.set_limits(*ceiling, *offset);
            let (c, o) = core.limits();
            tracing::info!(
                "cooling shell: the BMS's limits restored from flash: setpoint ceiling {c:.2} °C, plan ceiling offset {o:.2} K"
            );
            Some((c, o))
        }
        Err(e) => {
            tracing::error!(
                "cooling shell: the BMS's limits: {e}: none in force until the BMS writes them again"
            );
            None
        }
    }
}

/// Restores into `core`, whose hosts are `ids` (its configured host list,
/// [`journal::host_ids`]), what an earlier run learned, as the flash held
/// it (`records`); logs what was restored, or why not. A part kept for
/// other hosts (the list reordered, a host replaced or added) is refused
/// with its key and starts as configured, as one that does not read; what
/// the core learns from now on is kept as `ids`' figures.
pub(super) fn restore_learned_on(core: &mut Core, records: &LearnedRecords, ids: HostIds) {
    let read = records.decode_on(core.config(), ids);
    for why in &read.refused {
        tracing::error!("cooling shell: learned figures: {why}; that part starts as configured");
    }
    let restored = match &read.learned {
        None if read.refused.is_empty() => {
            tracing::info!(
                "cooling shell: no learned figures in flash: the hall is learned from the configured figures"
            );
            false
        }
        None => false,
        Some(l) => match core.restore_learned(l) {
            Ok(()) => {
                log_restored(core, l, read.read.len());
                true
            }
            Err(e) => {
                tracing::error!(
                    "cooling shell: learned figures in flash not restored ({e}): the hall is learned anew from the configured figures"
                );
                false
            }
        },
    };
    if !restored {
        let mut fresh = Learned::new(core.config());
        fresh.ids = ids;
        if let Err(e) = core.restore_learned(&fresh) {
            tracing::error!("cooling shell: the configured figures as learned: {e}");
        }
    }
}

/// Logs what was restored of what was learned (`l`, `parts` of them).
fn log_restored(core: &Core, l: &Learned, parts: usize) {
    let e = Estimates::of(core);
    let figures: Vec<String> = e
        .figures()
        .iter()
        .map(|f| match f.key {
            "fixed_loads" => format!(
                "{} {:+.0} W (trust {:.2})",
                f.name,
                f.estimated - f.configured,
                f.trust
            ),
            _ => format!("{} ×{:.2} (trust {:.2})", f.name, f.ratio(), f.trust),
        })
        .collect();
    let hosts: Vec<f32> = l
        .hosts
        .iter()
        .take(core.config().layout.hosts())
        .filter(|h| h.fed_s > 0.0)
        .map(|h| h.value)
        .collect();
    let span = match (
        hosts.iter().copied().reduce(f32::min),
        hosts.iter().copied().reduce(f32::max),
    ) {
        (Some(lo), Some(hi)) => {
            format!("{} hosts' thermal factors {lo:.2} to {hi:.2}", hosts.len())
        }
        _ => "no host's thermal factor".to_string(),
    };
    tracing::info!(
        "cooling shell: learned figures restored from flash ({parts} of {} parts): {}; {span}",
        journal::LEARNED_KEYS.len(),
        figures.join(", ")
    );
}

/// The resender of this CDU's logged events on `bus`, read through
/// `recorder`, for the `readers` that may resend; says at start when
/// none may, as every request will then be refused.
/// The bus started on `bc`, its QoS 1 frames kept in `outbox`; the
/// recorder attached to it, and the resender that answers `readers`.
pub(crate) fn start_bus(
    bc: BusConfig,
    outbox: Box<dyn loopwarden_bus::DurableOutbox>,
    recorder: &Recorder,
    readers: Vec<Signer>,
) -> (
    Bus,
    mpsc::Receiver<Inbound>,
    loopwarden_bus::BusTask,
    Resender,
) {
    let (bus, inbound, task) = Bus::start_with_outbox(bc, outbox);
    recorder.attach(bus.clone());
    let resender = start_resender(&bus, recorder, readers);
    (bus, inbound, task, resender)
}

fn start_resender(bus: &Bus, recorder: &Recorder, readers: Vec<Signer>) -> Resender {
    if readers.is_empty() {
        tracing::warn!(
            "cooling shell: no keyring: requests to resend logged events will be refused"
        );
    } else if !readers.iter().any(|r| r.may.resend) {
        tracing::warn!(
            "cooling shell: no reader of the keyring may resend: requests to resend logged events will be refused"
        );
    }
    Resender::start(bus.clone(), recorder.clone(), readers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn racks_without_a_rope_are_said_at_start() {
        let mut l = CoreConfig::default().layout;
        assert!(leak_sensing_notes(&l, true).is_empty());
        let none = leak_sensing_notes(&l, false);
        assert_eq!(none.len(), 1);
        assert!(none[0].starts_with("no board pins"), "{none:?}");
        l.unprotected = 0b1010;
        let notes = leak_sensing_notes(&l, true);
        assert_eq!(notes.len(), 1);
        assert!(
            notes[0].starts_with("racks 1, 3 have no leak rope"),
            "{notes:?}"
        );
        assert_eq!(leak_sensing_notes(&l, false).len(), 2);
        // A roped board still refuses a bare rack that is not declared.
        let mut core = CoreConfig::default();
        core.layout.unprotected = 0b1000;
        assert!(check_ropes(&core, Some(0b0111)).is_ok());
        assert!(check_ropes(&core, Some(0b0011)).is_err());
        assert!(check_ropes(&core, None).is_ok());
    }
    use cooling_core::estimate::Scalar;
    use futures::executor::block_on;
    use loopwarden_flash::ConfigStore;
    use loopwarden_store::agent_flash::AgentFlash;

    /// Sixteen hosts' ids, h05 and h09 exchanged with `swap`.
    fn hosts(swap: bool) -> HostIds {
        let mut h: Vec<Ident> = (0..16)
            .map(|i| Ident::new(&format!("h{i:02}")).unwrap())
            .collect();
        if swap {
            h.swap(5, 9);
        }
        journal::host_ids(&h)
    }

    /// The records a flash holds once `l` was kept in it.
    fn kept(l: &Learned) -> LearnedRecords {
        let board = loopwarden_boards::FlashBoard::host_file();
        let flash = AgentFlash::Memory(loopwarden_flash::sim::SimFlash::new(
            board.geometry.sectors as usize,
        ));
        let mut store = ConfigStore::open(flash, board.layout().config).unwrap();
        block_on(journal::save_learned(&mut store, l)).unwrap();
        block_on(journal::read_learned(&mut store))
    }

    /// A core of the reference hall, `records` restored into it for hosts
    /// `ids`.
    fn restored(records: &LearnedRecords, ids: HostIds) -> Core {
        let mut core = Core::new(CoreConfig::default()).unwrap();
        restore_learned_on(&mut core, records, ids);
        core
    }

    #[test]
    fn a_fouled_hosts_factor_is_not_restored_onto_the_host_now_in_its_place() {
        let mut l = Learned::new(&CoreConfig::default());
        l.ids = hosts(false);
        l.hosts[5] = Scalar {
            value: 1.37,
            var: 0.0004,
            fed_s: 3600.0,
            trust: 0.8,
        };
        l.hosts[9].fed_s = 3600.0;
        l.hosts[9].trust = 0.8;
        let records = kept(&l);

        let same = restored(&records, hosts(false)).learned();
        assert_eq!(same.hosts[5].value, 1.37);
        assert!((same.hosts[9].trust - 0.8).abs() < 0.005);

        let swapped = restored(&records, hosts(true)).learned();
        let configured = Learned::new(&CoreConfig::default());
        assert_eq!(swapped.hosts[5], configured.hosts[5], "h09, now 5th");
        assert_eq!(swapped.hosts[9], configured.hosts[9], "h05, now 9th");
        assert_eq!(swapped.ids, hosts(true), "kept next under the new list");
    }

    #[test]
    fn with_nothing_in_flash_what_is_learned_is_kept_under_the_hosts_ids() {
        let core = restored(&LearnedRecords::default(), hosts(false));
        assert_eq!(core.learned().ids, hosts(false));
        assert_eq!(core.learned().hosts, Learned::new(core.config()).hosts);
    }
}
