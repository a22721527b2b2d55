//! The sequences: generators of the things that happen.

use super::*;

pub(crate) fn bits() -> impl Strategy<Value = u16> {
    prop_oneof![3 => Just(0u16), 1 => 1u16..16, 1 => any::<u16>()]
}

pub(crate) fn harm() -> impl Strategy<Value = Harm> {
    prop_oneof![
        14 => Just(Harm::Clean),
        1 => Just(Harm::Twice),
        1 => (any::<u16>(), any::<u8>()).prop_map(|(at, mask)| Harm::Byte { at, mask }),
        1 => any::<u16>().prop_map(|keep| Harm::Cut { keep }),
        1 => any::<u16>().prop_map(|keep| Harm::TailLost { keep }),
        1 => any::<u8>().prop_map(Harm::Version),
        1 => Just(Harm::Garbled),
    ]
}

pub(crate) fn say() -> impl Strategy<Value = Say> {
    let status = (any::<u8>(), 0u8..4, bits(), bits(), bits(), any::<u8>()).prop_map(
        |(mode, reason, lost, sensing, wet, setpoint_dc)| Say::Status {
            mode,
            reason,
            lost,
            sensing,
            wet,
            setpoint_dc,
        },
    );
    let lease = (
        0u8..20,
        0u32..4,
        300u16..700,
        any::<u8>(),
        1u8..60,
        any::<bool>(),
    )
        .prop_map(|(host, lease, watts, gpus, duration_s, lift)| Say::Lease {
            host,
            lease,
            watts,
            gpus,
            duration_s,
            lift,
        });
    prop_oneof![
        6 => status,
        1 => (any::<bool>(), any::<bool>()).prop_map(|(pump_b, lag)| Say::Event { pump_b, lag }),
        2 => lease,
        4 => (any::<u8>(), any::<bool>()).prop_map(|(which, done)| Say::Answer { which, done }),
        1 => (5_000u32..5_004).prop_map(Say::Stray),
        1 => any::<bool>().prop_map(Say::Said),
        1 => prop::option::of(any::<u8>()).prop_map(Say::Offer),
    ]
}

pub(crate) fn reset() -> impl Strategy<Value = ResetCause> {
    prop_oneof![
        Just(ResetCause::PowerOn),
        Just(ResetCause::Watchdog),
        Just(ResetCause::Fault)
    ]
}

pub(crate) fn bms() -> impl Strategy<Value = BmsWrite> {
    prop_oneof![
        any::<u8>().prop_map(BmsWrite::Ceiling),
        any::<u8>().prop_map(BmsWrite::Offset),
        any::<i8>().prop_map(BmsWrite::Outdoor),
        Just(BmsWrite::Ack),
    ]
}

pub(crate) fn op() -> impl Strategy<Value = Op> {
    let gap_ms = prop_oneof![3 => 0u16..1_200, 1 => 1_200u16..5_000];
    let split = prop::option::weighted(0.2, (any::<u16>(), 0u16..1_500));
    let frame = (gap_ms, say(), harm(), split).prop_map(|(gap_ms, say, harm, split)| Op::Frame {
        gap_ms,
        say,
        harm,
        split,
    });
    let quiet = prop_oneof![
        3 => 100u32..2_900,
        2 => 2_900u32..3_500,
        2 => 3_500u32..15_000,
        1 => 15_000u32..70_000,
    ];
    prop_oneof![
        14 => frame,
        3 => (1u8..70).prop_map(Op::Steps),
        2 => (reset(), any::<bool>(), harm()).prop_map(|(reset, restored, harm)| Op::McuStarts {
            reset,
            restored,
            harm
        }),
        1 => (1u8..5).prop_map(Op::Skip),
        // Forward only: see the module note.
        1 => prop_oneof![0u32..5_000, 0u32..100_000].prop_map(Op::McuClock),
        3 => quiet.prop_map(Op::Quiet),
        1 => (-7_200i32..7_200).prop_map(Op::Wall),
        3 => prop::bool::weighted(0.8).prop_map(|reaches| Op::Clear { reaches }),
        2 => bms().prop_map(Op::Bms),
        1 => any::<u16>().prop_map(Op::Plan),
        1 => prop::bool::weighted(0.7).prop_map(Op::Bus),
        1 => prop::bool::weighted(0.7).prop_map(Op::Line),
        1 => (0u16..5_000).prop_map(Op::GatewayStarts),
    ]
}

pub(crate) fn hall() -> impl Strategy<Value = Hall> {
    prop_oneof![
        2 => Just(Hall::Alone),
        1 => Just(Hall::Member),
        1 => Just(Hall::Coordinator)
    ]
}
