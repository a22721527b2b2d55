//! One representative frame of every message kind: the examples of
//! `docs/bus.md`, the golden-byte fixtures of the tests and the input of the
//! benchmarks. The values are those of a busy H200 host on 32 °C water.

use heapless::Vec;

use crate::frame::{Frame, Message, MessageKind};
use crate::ids::{GpuIndex, Ident, NodeId, RackIndex, Role, Text};
use crate::message::*;
use crate::reason::ReasonCode;
use crate::units::*;

/// The secret of the signing key the sample commands are signed with (key
/// id 1), and the simulated hall's signers. Public, so for examples, tests
/// and the simulator only: a real site makes its own (`lwbus pki init`).
pub const DEMO_SIGNING_SEED: [u8; 32] = *b"loopwarden demo signing key 0001";

/// The demo signing key ([`DEMO_SIGNING_SEED`]).
pub fn demo_signing_key() -> crate::auth::SigningKey {
    crate::auth::SigningKey::from_bytes(&DEMO_SIGNING_SEED)
}

/// 2026-11-29 12:00:00 UTC.
pub const T0: TimestampMs = TimestampMs(1_795_953_600_000);

fn node(role: Role, id: &str) -> NodeId {
    NodeId::new(role, id).expect("sample names are idents")
}

fn gpu(i: u8) -> GpuIndex {
    GpuIndex::new(i).expect("sample GPU indices are below 16")
}

fn rack(i: u8) -> RackIndex {
    RackIndex::new(i).expect("sample rack indices are below 16")
}

fn pct(p: u8) -> Percent {
    Percent::new(p).expect("sample percentages are at most 100")
}

fn c(v: f64) -> Celsius {
    Celsius::new(v).expect("sample temperatures fit")
}

/// One GPU of a host at full load: the sample behind the 8-GPU frame size.
pub fn gpu_at_load(i: u8) -> GpuTelemetry {
    let i16 = i as u16;
    let i32 = i as u32;
    GpuTelemetry {
        gpu: gpu(i),
        flags: GpuFlags::RESPONSIVE | GpuFlags::ECC_ENABLED,
        unsupported: Unsupported::empty(),
        temp: WholeCelsius(61 + i % 4),
        mem_temp: WholeCelsius(58 + i % 3),
        power: Watts(655 + i32 * 3),
        power_limit: Watts(700),
        sm_clock: MegaHertz(1980),
        mem_clock: MegaHertz(2619),
        util: pct(98),
        throttle: ThrottleReasons::SW_POWER_CAP,
        ecc: EccCounts {
            sbe_volatile: i32 % 3,
            dbe_volatile: 0,
            sbe_aggregate: 12 + i32,
            dbe_aggregate: 0,
        },
        repair: MemoryRepair {
            retired_sbe: 0,
            retired_dbe: 0,
            remap_correctable: i16 % 2,
            remap_uncorrectable: 0,
        },
        pcie_replay: 20 + i32 * 5,
        nvlink: NvlinkErrors {
            crc: 30 + i32 * 7,
            replay: 0,
            recovery: 0,
        },
    }
}

/// An 8-GPU host at full load.
pub fn host_telemetry(gpus: u8) -> HostTelemetry {
    HostTelemetry {
        drops: crate::message::QueueDrops {
            xids: 12,
            flash: 0,
            bus: 1,
            acks_withheld: 0,
        },
        gpus: (0..gpus.min(16)).map(gpu_at_load).collect(),
    }
}

/// A cooling lease `lease` of `caps` (the GPUs and their limit in watts,
/// at most 16) for `duration_ms`, as a CDU asks when its capacity runs
/// short, unsigned: the sample lease, and the one tests build for their
/// own caps.
pub fn cooling_lease(lease: u32, caps: &[(GpuSelector, u32)], duration_ms: u32) -> CapLease {
    let mut list = Vec::new();
    for &(gpus, watts) in caps {
        list.push(GpuCap {
            gpus,
            limit: Watts(watts),
        })
        .expect("a lease holds at most 16 caps");
    }
    CapLease {
        lease,
        source: CapSource::Cooling,
        reason: ReasonCode::CAPACITY_SHORT,
        caps: list,
        duration: DurationMs(duration_ms),
        auth: CommandAuth::default(),
    }
}

/// The message of `kind` used in the docs and the golden fixtures.
pub fn message(kind: MessageKind) -> Message {
    match kind {
        MessageKind::HostTelemetry => Message::HostTelemetry(host_telemetry(8)),
        MessageKind::HostHealth => Message::HostHealth(HostHealth {
            gpus: (0..8)
                .map(|i| match i {
                    3 => GpuHealth {
                        gpu: gpu(3),
                        state: HealthState::Quarantined,
                        reason: ReasonCode::xid(79).expect("79 is an XID"),
                        since: TimestampMs(T0.0 - 7_340),
                        evidence: Text::truncated("XID 79 (fallen off the bus) at 11:59:52.660"),
                    },
                    5 => GpuHealth {
                        gpu: gpu(5),
                        state: HealthState::Degraded,
                        reason: ReasonCode::REMAP_PENDING,
                        since: TimestampMs(T0.0 - 60_000),
                        evidence: Text::truncated(
                            "row remap pending since 11:59:00: reset at next drain",
                        ),
                    },
                    _ => GpuHealth {
                        gpu: gpu(i),
                        state: HealthState::Healthy,
                        reason: ReasonCode::OK,
                        since: TimestampMs(T0.0 - 3_600_000),
                        evidence: Text::default(),
                    },
                })
                .collect(),
            monitoring: Monitoring::default(),
        }),
        MessageKind::Event => Message::Event(Event::Xid {
            gpu: gpu(3),
            xid: 79,
        }),
        // Signed in `frame`.
        MessageKind::CapLease => Message::CapLease(cooling_lease(
            17,
            &[(GpuSelector::All, 550), (GpuSelector::Gpu(gpu(6)), 450)],
            30_000,
        )),
        MessageKind::QuarantineRelease => Message::QuarantineRelease(QuarantineRelease {
            gpu: gpu(3),
            operator: Ident::new("jdoe").expect("an ident"),
            note: Text::truncated("reseated after XID 79; field diag passed"),
            auth: CommandAuth::default(), // signed in `frame`
        }),
        MessageKind::Ack => Message::Ack(Ack {
            correlation: Correlation {
                from: node(Role::Cdu, "cdu-a"),
                seq: 1234,
            },
            code: AckCode::Clamped,
            in_force: (0..8)
                .map(|i| GpuCap {
                    gpus: GpuSelector::Gpu(gpu(i)),
                    limit: Watts(if i == 6 { 200 } else { 550 }),
                })
                .collect(),
            detail: Text::truncated("GPU 6: 150 W is below its minimum 200 W; clamped to 200 W"),
        }),
        MessageKind::CduTelemetry => Message::CduTelemetry(cdu_telemetry()),
        MessageKind::CduState => Message::CduState(cdu_state()),
        MessageKind::Online => Message::Online(Online {
            online: true,
            software: Text::truncated("0.1.0"),
            started: TimestampMs(T0.0 - 86_400_000),
            clock: ClockSource::UnixEpoch,
        }),
        MessageKind::ResendRequest => Message::ResendRequest(ResendRequest {
            from: 86_390,
            to: 86_402,
            auth: CommandAuth::default(), // signed in `frame`
        }),
        MessageKind::ResendReport => Message::ResendReport(ResendReport {
            correlation: Correlation {
                from: node(Role::Facility, "bms1"),
                seq: 310,
            },
            code: ResendCode::Limited,
            from: 86_390,
            to: 86_402,
            resent: 4,
            held_from: Some(12_001),
            next: Some(86_399),
        }),
    }
}

/// The CDU telemetry used in the docs and the golden fixtures.
fn cdu_telemetry() -> CduTelemetry {
    CduTelemetry {
        supply: Some(c(32.05)),
        return_temp: Some(c(41.6)),
        setpoint: c(32.0),
        flow: Some(LitresPerMinute::new(172.8).expect("fits")),
        diff_pressure: Some(KiloPascals::new(95.5).expect("fits")),
        facility_supply: Some(c(28.9)),
        ambient: Some(c(22.4)),
        reservoir: Some(pct(81)),
        pump_a: PumpStatus {
            running: true,
            command: pct(60),
            feedback: Some(pct(59)),
        },
        pump_b: PumpStatus::default(),
        racks: (0..4)
            .map(|r| RackStatus {
                rack: rack(r),
                valve: pct(100),
                leak: false,
            })
            .collect(),
        it_power: Some(Watts(108_400)),
        cooling_power: Some(Watts(3_900)),
        facility_power: Some(Watts(117_550)),
        pue: Some(Pue::new(1.084).expect("fits")),
        learned: Some(HallEstimates {
            host_factor_min_permille: 987,
            host_factor_max_permille: 1_412,
            host_factor_max_host: Some(Ident::new("r1h2").expect("an ident")),
            host_trust_min_pct: pct(64),
            dry_cooler_ua: FigureEstimate {
                ratio_permille: 652,
                confidence_pct: pct(83),
                trust_pct: pct(71),
            },
            chiller_cop: FigureEstimate {
                ratio_permille: 1_000,
                confidence_pct: pct(4),
                trust_pct: pct(4),
            },
            pump_power: FigureEstimate {
                ratio_permille: 1_043,
                confidence_pct: pct(58),
                trust_pct: pct(58),
            },
            flow_per_gpu_full_lpm: LitresPerMinute::new(1.38).expect("fits"),
            approach_centikelvin: 285,
            outdoor_fallback: false,
        }),
    }
}

/// The CDU state used in the docs and the golden fixtures.
fn cdu_state() -> CduState {
    CduState {
        mode: CduMode::Degraded,
        reason: ReasonCode::CAPACITY_SHORT,
        since: TimestampMs(T0.0 - 95_000),
        setpoint: c(32.0),
        supply: Some(c(33.4)),
        flow_per_gpu: Some(LitresPerMinute::new(1.35).expect("fits")),
        racks: (0..4)
            .map(|r| RackState {
                rack: rack(r),
                cooling: if r == 2 {
                    RackCooling::Lost
                } else {
                    RackCooling::Normal
                },
                sensing: LeakSensing::Supervised,
            })
            .collect(),
        facility: Some(FacilityState {
            offer: Some(FacilityOffer {
                accept: c(29.5),
                heat: Watts(118_400),
                at_water: c(29.0),
                heat_per_k: Watts(310),
                work_centigpus: 12_160,
                capped: [(30.5, 40, 450), (31.5, 95, 1_020)]
                    .iter()
                    .map(|&(w, lost, saved)| OfferStep {
                        water: c(w),
                        work_lost_centigpus: lost,
                        power_saved: Watts(saved),
                    })
                    .collect(),
            }),
            plan: Some(FacilityPlan {
                water: c(29.0),
                chiller_stages: 2,
                offers: 4,
                capping: 0,
            }),
        }),
        auth: CommandAuth::default(), // signed in `frame`
    }
}

/// The frame of `kind` used in the docs and the golden fixtures: sent by
/// host `h07` (or `cdu-a` for CDU kinds, `jdoe` for a release). Commands
/// are signed with [`demo_signing_key`] as key 1, for host `h07` of site `hall-1`
/// ([`command_topic`]); the CDU state, with the same key, for its topic
/// ([`cdu_state_topic`]).
pub fn frame(kind: MessageKind) -> Frame {
    let sender = match kind {
        MessageKind::CduTelemetry | MessageKind::CduState | MessageKind::CapLease => {
            node(Role::Cdu, "cdu-a")
        }
        MessageKind::QuarantineRelease => node(Role::Operator, "jdoe"),
        MessageKind::ResendRequest => node(Role::Facility, "bms1"),
        _ => node(Role::Host, "h07"),
    };
    let mut frame = Frame {
        sender,
        seq: 86_400 + kind as u32,
        time: T0,
        message: message(kind),
    };
    if kind.family() == crate::topic::Family::Cmd {
        frame
            .sign(&command_topic(), 1, &demo_signing_key())
            .expect("sample commands can be signed");
    }
    if kind == MessageKind::CduState {
        frame
            .sign(&cdu_state_topic(), 1, &demo_signing_key())
            .expect("the sample state can be signed");
    }
    if kind == MessageKind::ResendRequest {
        frame
            .sign(&resend_topic(), 1, &demo_signing_key())
            .expect("the sample request can be signed");
    }
    frame
}

/// The topic the sample CDU state is signed for: CDU `cdu-a` of site
/// `hall-1` (`dc/v2/hall-1/cdu/cdu-a/health`).
pub fn cdu_state_topic() -> crate::topic::Topic {
    crate::topic::Topic::new(
        &crate::ids::Ident::new("hall-1").expect("an ident"),
        Role::Cdu,
        &crate::ids::Ident::new("cdu-a").expect("an ident"),
        crate::topic::Family::Health,
    )
}

/// The topic the sample resend request is signed for: host `h07`'s
/// (`dc/v2/hall-1/host/h07/resend`).
pub fn resend_topic() -> crate::topic::Topic {
    let mut t = command_topic();
    t.family = crate::topic::Family::Resend;
    t
}

/// The target the sample commands are signed for: host `h07` of site
/// `hall-1` (`dc/v2/hall-1/host/h07/cmd`).
pub fn command_topic() -> crate::topic::Topic {
    crate::topic::Topic::new(
        &crate::ids::Ident::new("hall-1").expect("an ident"),
        Role::Host,
        &crate::ids::Ident::new("h07").expect("an ident"),
        crate::topic::Family::Cmd,
    )
}
