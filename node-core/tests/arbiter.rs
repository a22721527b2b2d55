//! Random lease sequences against a simple model: the limit in force is
//! always the lowest of the valid leases and the guard, within the GPU's
//! settable range, and a refused lease changes nothing.

use loopwarden_protocol::samples::cooling_lease;
use loopwarden_protocol::{
    AckCode, CapLease, CapSource, GpuIndex, GpuSelector, NodeId, Role, TimestampMs, Watts,
};
use node_core::caps::{CapArbiter, GpuRange};
use proptest::prelude::*;

const GPUS: usize = 4;
const RANGE: GpuRange = GpuRange {
    min: Watts(200),
    max: Watts(700),
};

#[derive(Debug, Clone)]
enum Op {
    /// A lease from sender `from` with id `id`: caps (gpu or all, watts).
    Lease {
        from: u8,
        id: u32,
        caps: Vec<(Option<u8>, u32)>,
        sent_ago: u32,
        ms: u32,
    },
    Guard {
        gpu: u8,
        cap: Option<u32>,
    },
    Wait {
        ms: u32,
    },
    /// To the next expiry exactly, where a lease must already have lapsed.
    WaitForExpiry,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..3, 0u32..3, proptest::collection::vec((proptest::option::of(0u8..5), 0u32..900), 0..4), 0u32..3_000, 0u32..10_000)
            .prop_map(|(from, id, caps, sent_ago, ms)| Op::Lease { from, id, caps, sent_ago, ms }),
        1 => (0u8..5, proptest::option::of(100u32..800)).prop_map(|(gpu, cap)| Op::Guard { gpu, cap }),
        2 => (0u32..6_000).prop_map(|ms| Op::Wait { ms }),
        1 => Just(Op::WaitForExpiry),
    ]
}

fn sender(i: u8) -> NodeId {
    let (role, id) = [
        (Role::Cdu, "cdu-a"),
        (Role::Facility, "budget"),
        (Role::Operator, "jdoe"),
    ][i as usize];
    NodeId::new(role, id).unwrap()
}

/// The source a lease of sender `i` names: its role's.
fn source(i: u8) -> CapSource {
    [
        CapSource::Cooling,
        CapSource::FacilityBudget,
        CapSource::Operator,
    ][i as usize]
}

/// The model: every accepted lease with its expiry; the guard per GPU.
#[derive(Default)]
struct Model {
    leases: Vec<(u8, u32, Vec<Option<u32>>, u64)>,
    guard: [Option<u32>; GPUS],
}

impl Model {
    fn limit(&self, gpu: usize, now: u64) -> u32 {
        let caps = self
            .leases
            .iter()
            .filter(|l| l.3 > now)
            .filter_map(|l| l.2[gpu])
            .chain(self.guard[gpu]);
        caps.fold(RANGE.max.0, u32::min).max(RANGE.min.0)
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn limit_in_force_is_the_lowest_valid_cap_within_range(ops in proptest::collection::vec(op(), 1..40)) {
        let mut a = CapArbiter::new(vec![RANGE; GPUS]);
        let mut m = Model::default();
        let mut now = 100_000u64;
        for op in ops {
            match op {
                Op::Lease { from, id, caps, sent_ago, ms } => {
                    let sent = now - sent_ago as u64;
                    let selected: Vec<_> = caps
                        .iter()
                        .map(|(g, w)| (g.map_or(GpuSelector::All, |g| GpuSelector::Gpu(GpuIndex::new(g).unwrap())), *w))
                        .collect();
                    let lease = CapLease { source: source(from), ..cooling_lease(id, &selected, ms) };
                    let code = a.lease(TimestampMs(now), &sender(from), TimestampMs(sent), &lease).code;
                    let unknown = caps.iter().any(|(g, _)| g.is_some_and(|g| g as usize >= GPUS));
                    let expected = if caps.is_empty() || ms == 0 {
                        AckCode::Malformed
                    } else if sent + ms as u64 <= now {
                        AckCode::Expired
                    } else if unknown {
                        AckCode::UnknownGpu
                    } else if caps.iter().any(|(_, w)| *w < RANGE.min.0) {
                        AckCode::Clamped
                    } else {
                        AckCode::Ok
                    };
                    prop_assert_eq!(code, expected);
                    if matches!(code, AckCode::Ok | AckCode::Clamped) {
                        let mut per_gpu = vec![None; GPUS];
                        for (g, w) in &caps {
                            for i in g.map_or(0..GPUS, |g| g as usize..g as usize + 1) {
                                per_gpu[i] = Some(per_gpu[i].map_or(*w, |c: u32| c.min(*w)));
                            }
                        }
                        m.leases.retain(|l| !(l.0 == from && l.1 == id));
                        m.leases.push((from, id, per_gpu, sent + ms as u64));
                    }
                }
                Op::Guard { gpu, cap } => {
                    a.guard(GpuIndex::new(gpu).unwrap(), cap.map(Watts));
                    if (gpu as usize) < GPUS {
                        m.guard[gpu as usize] = cap;
                    }
                }
                Op::Wait { ms } => now += ms as u64,
                Op::WaitForExpiry => {
                    if let Some(t) = a.next_expiry() {
                        now = now.max(t.0);
                    }
                }
            }
            for f in a.in_force(TimestampMs(now)) {
                let i = f.gpu.get() as usize;
                prop_assert_eq!(f.limit.0, m.limit(i, now), "GPU {} at {}", i, now);
                prop_assert!(f.limit >= RANGE.min && f.limit <= RANGE.max);
                prop_assert_eq!(f.source.is_none(), f.limit == RANGE.max);
            }
        }
    }
}
