//! Property tests of the codec: arbitrary bytes never panic the decoder and
//! never decode to something that re-encodes differently; encode → decode
//! is the identity for arbitrary valid messages, as frames and as JSON.

use loopwarden_protocol::message::*;
use loopwarden_protocol::*;
use proptest::collection::vec;
use proptest::prelude::*;

fn ident() -> impl Strategy<Value = Ident> {
    "[A-Za-z0-9_.-]{1,32}".prop_map(|s| Ident::new(&s).unwrap())
}

fn text<const N: usize>() -> impl Strategy<Value = Text<N>> {
    ".{0,40}".prop_map(|s| Text::truncated(&s))
}

fn node() -> impl Strategy<Value = NodeId> {
    (
        prop_oneof![
            Just(Role::Host),
            Just(Role::Cdu),
            Just(Role::Operator),
            Just(Role::Facility)
        ],
        ident(),
    )
        .prop_map(|(role, id)| NodeId { role, id })
}

fn gpu() -> impl Strategy<Value = GpuIndex> {
    (0u8..16).prop_map(|i| GpuIndex::new(i).unwrap())
}

fn rack() -> impl Strategy<Value = RackIndex> {
    (0u8..16).prop_map(|i| RackIndex::new(i).unwrap())
}

fn pct() -> impl Strategy<Value = Percent> {
    (0u8..=100).prop_map(|p| Percent::new(p).unwrap())
}

/// Named reasons, XIDs and unknown codes alike.
fn reason() -> impl Strategy<Value = ReasonCode> {
    let named: Vec<ReasonCode> = ReasonCode::NAMED.iter().map(|(c, _)| *c).collect();
    prop_oneof![
        proptest::sample::select(named),
        (1u16..=999).prop_map(ReasonCode),
        any::<u16>().prop_map(ReasonCode),
    ]
}

fn celsius() -> impl Strategy<Value = Celsius> {
    any::<i16>().prop_map(Celsius::from_raw)
}

fn health_state() -> impl Strategy<Value = HealthState> {
    prop_oneof![
        Just(HealthState::Healthy),
        Just(HealthState::Degraded),
        Just(HealthState::Quarantined)
    ]
}

fn cap_source() -> impl Strategy<Value = CapSource> {
    prop_oneof![
        Just(CapSource::ThermalGuard),
        Just(CapSource::Cooling),
        Just(CapSource::FacilityBudget),
        Just(CapSource::Operator)
    ]
}

fn cdu_mode() -> impl Strategy<Value = CduMode> {
    prop_oneof![
        Just(CduMode::Boot),
        Just(CduMode::Normal),
        Just(CduMode::Degraded),
        Just(CduMode::Failsafe)
    ]
}

fn auth() -> impl Strategy<Value = CommandAuth> {
    (any::<u8>(), any::<[[u8; 32]; 2]>()).prop_map(|(key_id, signature)| CommandAuth {
        key_id,
        signature,
        ..CommandAuth::default()
    })
}

fn gpu_cap() -> impl Strategy<Value = GpuCap> {
    (
        prop_oneof![Just(GpuSelector::All), gpu().prop_map(GpuSelector::Gpu)],
        any::<u32>(),
    )
        .prop_map(|(gpus, w)| GpuCap {
            gpus,
            limit: Watts(w),
        })
}

fn hv<T: std::fmt::Debug, const N: usize>(
    s: impl Strategy<Value = T>,
) -> impl Strategy<Value = heapless::Vec<T, N>> {
    vec(s, 0..=N).prop_map(|v| v.into_iter().collect())
}

fn gpu_telemetry() -> impl Strategy<Value = GpuTelemetry> {
    (
        (gpu(), any::<u8>(), any::<u16>(), any::<u8>(), any::<u8>()),
        (
            any::<u32>(),
            any::<u32>(),
            any::<u16>(),
            any::<u16>(),
            pct(),
            any::<u16>(),
        ),
        (
            any::<[u32; 4]>(),
            any::<[u16; 4]>(),
            any::<u32>(),
            any::<[u32; 3]>(),
        ),
    )
        .prop_map(|(a, b, c)| GpuTelemetry {
            gpu: a.0,
            flags: GpuFlags::from_bits(a.1),
            unsupported: Unsupported::from_bits(a.2),
            temp: WholeCelsius(a.3),
            mem_temp: WholeCelsius(a.4),
            power: Watts(b.0),
            power_limit: Watts(b.1),
            sm_clock: MegaHertz(b.2),
            mem_clock: MegaHertz(b.3),
            util: b.4,
            throttle: ThrottleReasons::from_bits(b.5),
            ecc: EccCounts {
                sbe_volatile: c.0[0],
                dbe_volatile: c.0[1],
                sbe_aggregate: c.0[2],
                dbe_aggregate: c.0[3],
            },
            repair: MemoryRepair {
                retired_sbe: c.1[0],
                retired_dbe: c.1[1],
                remap_correctable: c.1[2],
                remap_uncorrectable: c.1[3],
            },
            pcie_replay: c.2,
            nvlink: NvlinkErrors {
                crc: c.3[0],
                replay: c.3[1],
                recovery: c.3[2],
            },
        })
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        (gpu(), any::<u16>()).prop_map(|(gpu, xid)| Event::Xid { gpu, xid }),
        (gpu(), health_state(), health_state(), reason()).prop_map(|(gpu, from, to, reason)| {
            Event::HealthChanged {
                gpu,
                from,
                to,
                reason,
            }
        }),
        (gpu(), any::<u32>(), proptest::option::of(cap_source())).prop_map(|(gpu, w, source)| {
            Event::CapApplied {
                gpu,
                limit: Watts(w),
                source,
            }
        }),
        (gpu(), any::<bool>(), proptest::option::of(any::<i32>()))
            .prop_map(|(gpu, ok, exit_code)| Event::QuarantineAction { gpu, ok, exit_code }),
        (gpu(), ident(), text()).prop_map(|(gpu, operator, note)| Event::QuarantineReleased {
            gpu,
            operator,
            note
        }),
        (any::<u16>(), reason())
            .prop_map(|(gpus, reason)| Event::CoolingAttributed { gpus, reason }),
        (rack(), any::<bool>()).prop_map(|(rack, active)| Event::Leak { rack, active }),
        (cdu_mode(), cdu_mode(), reason()).prop_map(|(from, to, reason)| Event::CduModeChanged {
            from,
            to,
            reason
        }),
        (prop_oneof![Just(Pump::A), Just(Pump::B)], any::<bool>())
            .prop_map(|(pump, lag_started)| Event::PumpTrip { pump, lag_started }),
        (
            prop_oneof![
                Just(Sensor::SupplyTemp),
                Just(Sensor::Flow),
                Just(Sensor::LeakInput)
            ],
            proptest::option::of(rack()),
            prop_oneof![
                Just(SensorFault::Stuck),
                Just(SensorFault::Lost),
                Just(SensorFault::Cleared)
            ]
        )
            .prop_map(|(sensor, rack, fault)| Event::SensorFault {
                sensor,
                rack,
                fault
            }),
        (prop_oneof![Just(Pump::A), Just(Pump::B)], any::<bool>())
            .prop_map(|(pump, lag_started)| Event::PumpSeized { pump, lag_started }),
        (rack(), any::<bool>()).prop_map(|(rack, lost)| Event::LeakSensing { rack, lost }),
        (rack(), any::<bool>()).prop_map(|(rack, active)| Event::IsolationFailed { rack, active }),
        (
            any::<u16>(),
            0u8..4,
            prop_oneof![Just(Pump::A), Just(Pump::B)]
        )
            .prop_map(
                |(leaks_latched, pumps_out, lead)| Event::ControllerRestored {
                    leaks_latched,
                    pumps_out,
                    lead
                }
            ),
        (
            proptest::option::of(rack()),
            proptest::option::of(prop_oneof![Just(Pump::A), Just(Pump::B)]),
            ident()
        )
            .prop_map(|(rack, pump, operator)| Event::OperatorCleared {
                rack,
                pump,
                operator
            }),
        (any::<u16>(), any::<u64>()).prop_map(|(gpus, since)| Event::HostStalled {
            gpus,
            since: TimestampMs(since)
        }),
        any::<u64>().prop_map(|t| Event::HostResumed {
            stalled_since: TimestampMs(t)
        }),
        any::<bool>().prop_map(|running| Event::XidWatch { running }),
        (
            prop_oneof![
                Just(CoolingStep::Drain),
                Just(CoolingStep::PowerDown),
                Just(CoolingStep::PowerUp),
                Just(CoolingStep::Resume)
            ],
            any::<bool>(),
            proptest::option::of(any::<i32>())
        )
            .prop_map(|(step, ok, exit_code)| Event::CoolingAction {
                step,
                ok,
                exit_code
            }),
        (
            any::<u16>(),
            any::<u32>(),
            proptest::option::of(cap_source())
        )
            .prop_map(|(gpus, w, source)| Event::CapsApplied {
                gpus,
                limit: Watts(w),
                source,
            }),
    ]
}

fn pump() -> impl Strategy<Value = PumpStatus> {
    (any::<bool>(), pct(), proptest::option::of(pct())).prop_map(|(running, command, feedback)| {
        PumpStatus {
            running,
            command,
            feedback,
        }
    })
}

fn figure_estimate() -> impl Strategy<Value = FigureEstimate> {
    (any::<u16>(), pct(), pct()).prop_map(|(ratio_permille, confidence_pct, trust_pct)| {
        FigureEstimate {
            ratio_permille,
            confidence_pct,
            trust_pct,
        }
    })
}

fn hall_estimates() -> impl Strategy<Value = HallEstimates> {
    (
        (
            any::<u16>(),
            any::<u16>(),
            proptest::option::of(ident()),
            pct(),
        ),
        (figure_estimate(), figure_estimate(), figure_estimate()),
        (any::<u32>(), any::<u16>(), any::<bool>()),
    )
        .prop_map(
            |((min, max, host, trust), (ua, cop, pump), (flow, approach, fb))| HallEstimates {
                host_factor_min_permille: min,
                host_factor_max_permille: max,
                host_factor_max_host: host,
                host_trust_min_pct: trust,
                dry_cooler_ua: ua,
                chiller_cop: cop,
                pump_power: pump,
                flow_per_gpu_full_lpm: LitresPerMinute::from_raw(flow),
                approach_centikelvin: approach,
                outdoor_fallback: fb,
            },
        )
}

fn message() -> impl Strategy<Value = Message> {
    prop_oneof![
        (hv(gpu_telemetry()), any::<(u32, u32, u32, u32)>()).prop_map(
            |(gpus, (xids, flash, bus, acks_withheld))| {
                Message::HostTelemetry(HostTelemetry {
                    gpus,
                    drops: QueueDrops {
                        xids,
                        flash,
                        bus,
                        acks_withheld,
                    },
                })
            }
        ),
        hv(
            (gpu(), health_state(), reason(), any::<u64>(), text()).prop_map(
                |(gpu, state, reason, since, evidence)| GpuHealth {
                    gpu,
                    state,
                    reason,
                    since: TimestampMs(since),
                    evidence,
                }
            )
        )
        .prop_flat_map(|gpus| {
            (
                proptest::option::of(any::<u64>()),
                proptest::option::of(any::<u64>()),
            )
                .prop_map(move |(stalled, xid_down)| {
                    Message::HostHealth(HostHealth {
                        gpus: gpus.clone(),
                        monitoring: Monitoring {
                            stalled_since: stalled.map(TimestampMs),
                            xid_watch_down_since: xid_down.map(TimestampMs),
                        },
                    })
                })
        }),
        event().prop_map(Message::Event),
        (
            any::<u32>(),
            cap_source(),
            reason(),
            hv(gpu_cap()),
            any::<u32>(),
            auth()
        )
            .prop_map(|(lease, source, reason, caps, d, auth)| Message::CapLease(
                CapLease {
                    lease,
                    source,
                    reason,
                    caps,
                    duration: DurationMs(d),
                    auth,
                }
            )),
        (gpu(), ident(), text(), auth()).prop_map(|(gpu, operator, note, auth)| {
            Message::QuarantineRelease(QuarantineRelease {
                gpu,
                operator,
                note,
                auth,
            })
        }),
        (node(), any::<u32>(), hv(gpu_cap()), text()).prop_map(|(from, seq, in_force, detail)| {
            Message::Ack(Ack {
                correlation: Correlation { from, seq },
                code: AckCode::Failed,
                in_force,
                detail,
            })
        }),
        (
            (
                proptest::option::of(celsius()),
                proptest::option::of(celsius()),
                celsius(),
                proptest::option::of(any::<u32>()),
                proptest::option::of(any::<u16>()),
                proptest::option::of(celsius()),
                proptest::option::of(pct()),
            ),
            (pump(), pump()),
            hv(
                (rack(), pct(), any::<bool>()).prop_map(|(rack, valve, leak)| RackStatus {
                    rack,
                    valve,
                    leak
                })
            ),
            proptest::option::of(any::<u32>()),
            proptest::option::of(any::<u16>()),
            proptest::option::of(hall_estimates()),
        )
            .prop_map(|(a, (pump_a, pump_b), racks, power, pue, learned)| {
                Message::CduTelemetry(CduTelemetry {
                    supply: a.0,
                    return_temp: a.1,
                    setpoint: a.2,
                    flow: a.3.map(LitresPerMinute::from_raw),
                    diff_pressure: a.4.map(KiloPascals::from_raw),
                    facility_supply: a.5,
                    ambient: None,
                    reservoir: a.6,
                    pump_a,
                    pump_b,
                    racks,
                    it_power: power.map(Watts),
                    cooling_power: power.map(|p| Watts(p / 3)),
                    facility_power: None,
                    pue: pue.map(Pue::from_raw),
                    learned,
                })
            }),
        (
            cdu_mode(),
            reason(),
            any::<u64>(),
            celsius(),
            proptest::option::of(celsius()),
            hv(
                (rack(), any::<bool>(), 0u8..3).prop_map(|(rack, lost, s)| RackState {
                    rack,
                    cooling: if lost {
                        RackCooling::Lost
                    } else {
                        RackCooling::Normal
                    },
                    sensing: [
                        LeakSensing::Supervised,
                        LeakSensing::Lost,
                        LeakSensing::Unprotected
                    ][usize::from(s)],
                })
            ),
            auth(),
        )
            .prop_map(|(mode, reason, since, setpoint, supply, racks, auth)| {
                Message::CduState(CduState {
                    mode,
                    reason,
                    since: TimestampMs(since),
                    setpoint,
                    supply,
                    flow_per_gpu: None,
                    racks,
                    facility: None,
                    auth,
                })
            }),
        (any::<bool>(), text(), any::<u64>(), any::<bool>()).prop_map(
            |(online, software, started, rtc)| Message::Online(Online {
                online,
                software,
                started: TimestampMs(started),
                clock: if rtc {
                    ClockSource::UnixEpoch
                } else {
                    ClockSource::SinceBoot
                },
            })
        ),
    ]
}

fn frame() -> impl Strategy<Value = Frame> {
    (node(), any::<u32>(), any::<u64>(), message()).prop_map(|(sender, seq, t, message)| Frame {
        sender,
        seq,
        time: TimestampMs(t),
        message,
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn encode_then_decode_is_identity(f in frame()) {
        let bytes = f.to_vec().unwrap();
        prop_assert!(bytes.len() <= MAX_FRAME_LEN);
        prop_assert_eq!(Frame::decode(&bytes).unwrap(), f);
    }

    #[test]
    fn json_then_back_is_identity(f in frame()) {
        let json = f.to_json();
        prop_assert_eq!(Frame::from_json(&json).unwrap(), f);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in vec(any::<u8>(), 0..600)) {
        let _ = Frame::decode(&bytes);
    }

    /// Bytes with a valid CRC get past the integrity check and exercise the
    /// header and body decoders; whatever decodes is a valid frame that
    /// survives its own round trip.
    #[test]
    fn arbitrary_bytes_with_valid_crc_never_panic(kind in 1u8..=9, body in vec(any::<u8>(), 0..400)) {
        let mut bytes = vec![2, 0, kind];
        bytes.extend_from_slice(&body);
        let crc = crc::Crc::<u32>::new(&crc::CRC_32_ISO_HDLC).checksum(&bytes);
        bytes.extend_from_slice(&crc.to_le_bytes());
        if let Ok(f) = Frame::decode(&bytes) {
            prop_assert_eq!(Frame::decode(&f.to_vec().unwrap()).unwrap(), f);
        }
    }

    /// Flipping any one bit of a valid frame is caught.
    #[test]
    fn any_single_bit_flip_is_refused(f in frame(), bit in any::<usize>()) {
        let mut bytes = f.to_vec().unwrap();
        let bit = bit % (bytes.len() * 8);
        bytes[bit / 8] ^= 1 << (bit % 8);
        prop_assert!(Frame::decode(&bytes).is_err());
    }

    /// A frame cut short anywhere is refused.
    #[test]
    fn any_truncation_is_refused(f in frame(), cut in any::<usize>()) {
        let bytes = f.to_vec().unwrap();
        let cut = cut % bytes.len();
        prop_assert!(Frame::decode(&bytes[..cut]).is_err());
    }
}
