//! How the fleet's hosts are split among its CDUs, and what each CDU's
//! hall plays: full load at a given outdoor temperature, GPUs failing (XID 79) on a spread
//! of hosts at spread times, and a cooling shortfall in some CDUs.
//!
//! Limits, from the protocol, the controller's core and its board: a CDU
//! holds at most [`cooling_core::MAX_RACKS`] racks (the CDU state frame
//! carries at most [`loopwarden_protocol::MAX_RACKS`]), and no more than
//! its board has leak ropes for (the simulated controller board,
//! `boards/pins/sim-controller.toml`, has 4); at most
//! [`cooling_core::MAX_HOSTS`] hosts; a host has at most
//! [`loopwarden_protocol::MAX_GPUS`] GPUs. A split those cannot hold is
//! refused with the reason and the fewest CDUs that would do.
//!
//! Glossary:
//! - *injection*: one GPU failed by the hall's scenario (`gpu_fail`), which
//!   its agent sees as XID 79.
//! - *shortfall*: the lead pump trips while the lag pump is seized: no
//!   flow, the GPUs heat up and the controller caps its hosts.

use loopwarden_protocol::MAX_RACKS;

/// GPUs per simulated host.
pub const GPUS_PER_HOST: usize = 8;
/// A hall's scenario runs this much longer than the fleet, s.
const SCENARIO_SLACK_S: u64 = 600;

/// One CDU: its id, its racks and its hosts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CduLayout {
    /// Its id on the bus (`cdu1`, `cdu2`, …).
    pub name: String,
    /// Racks.
    pub racks: usize,
    /// Hosts per rack.
    pub hosts_per_rack: usize,
    /// Each host's id, rack-major (`c1r0h0`, …).
    pub host_ids: Vec<String>,
}

/// Splits `hosts` among `cdus` as evenly as whole hosts allow, each CDU
/// as racks × hosts per rack; refuses what the controller or the
/// protocol cannot hold.
pub fn plan(hosts: usize, cdus: usize) -> Result<Vec<CduLayout>, String> {
    if cdus == 0 || hosts == 0 {
        return Err("--hosts and --cdus must be at least 1".into());
    }
    if hosts < cdus {
        return Err(format!(
            "{hosts} hosts for {cdus} CDUs: every CDU needs at least one host"
        ));
    }
    let max_hosts = cooling_core::MAX_HOSTS;
    let most = hosts.div_ceil(cdus);
    if most > max_hosts {
        return Err(format!(
            "{hosts} hosts on {cdus} CDUs puts {most} hosts on a CDU; a cooling controller \
             holds at most {max_hosts} (cooling-core MAX_HOSTS): use --cdus {} or more",
            hosts.div_ceil(max_hosts)
        ));
    }
    (0..cdus)
        .map(|c| {
            let n = hosts / cdus + usize::from(c < hosts % cdus);
            let (racks, per_rack) = racks_of(n)?;
            let host_ids = (0..n)
                .map(|h| format!("c{}r{}h{}", c + 1, h / per_rack, h % per_rack))
                .collect();
            Ok(CduLayout {
                name: format!("cdu{}", c + 1),
                racks,
                hosts_per_rack: per_rack,
                host_ids,
            })
        })
        .collect()
}

/// Racks a CDU can have: the protocol's and the core's limit, and the
/// leak ropes of the controller board the fleet's controllers run on.
pub fn max_racks() -> usize {
    let ropes = loopwarden_boards::pins::PinMap::sim_controller()
        .ropes
        .len();
    cooling_core::MAX_RACKS.min(MAX_RACKS).min(ropes)
}

/// `n` hosts as racks × hosts per rack, racks at most [`max_racks`], as
/// square as the divisors allow.
fn racks_of(n: usize) -> Result<(usize, usize), String> {
    let max_racks = max_racks();
    (1..=max_racks.min(n))
        .filter(|r| n % r == 0 && n / r <= usize::from(u8::MAX))
        .min_by_key(|r| r.abs_diff(n / r))
        .map(|r| (r, n / r))
        .ok_or_else(|| format!("{n} hosts cannot be laid out in at most {max_racks} racks"))
}

/// One GPU to fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Injection {
    /// Its CDU (index into the layouts).
    pub cdu: usize,
    /// Its host within the CDU (rack-major).
    pub host: usize,
    /// Its GPU.
    pub gpu: usize,
    /// When, hall seconds.
    pub at_s: u64,
}

/// What the halls play besides full load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FaultPlan {
    /// GPUs failed, in time order.
    pub injections: Vec<Injection>,
    /// CDUs whose pumps fail (indices), and when, hall seconds.
    pub shortfall: Vec<usize>,
    /// When the shortfall begins, hall seconds.
    pub shortfall_at_s: u64,
}

/// `xids` failures on hosts spread over the fleet at times spread over
/// `[from_s, until_s]` (host order and time order are shuffled apart),
/// and the shortfall in `shortfall_cdus` CDUs spread over the fleet.
pub fn faults(
    layouts: &[CduLayout],
    xids: usize,
    window_s: (u64, u64),
    shortfall_cdus: usize,
    shortfall_at_s: u64,
) -> FaultPlan {
    let hosts: Vec<(usize, usize)> = layouts
        .iter()
        .enumerate()
        .flat_map(|(c, l)| (0..l.host_ids.len()).map(move |h| (c, h)))
        .collect();
    let n = xids.min(hosts.len());
    let (from, until) = (window_s.0, window_s.1.max(window_s.0));
    // A stride coprime with n shuffles the times against host order.
    let stride = (1..=n)
        .rev()
        .find(|s| gcd(*s, n) == 1 && *s * 2 <= n.max(2) + 1);
    let stride = stride.unwrap_or(1);
    let mut injections: Vec<Injection> = (0..n)
        .map(|i| {
            let (cdu, host) = hosts[i * hosts.len() / n];
            let slot = (i * stride) % n;
            let at_s = from + (until - from) * slot as u64 / (n.max(2) - 1) as u64;
            Injection {
                cdu,
                host,
                gpu: i % GPUS_PER_HOST,
                at_s,
            }
        })
        .collect();
    injections.sort_by_key(|x| x.at_s);
    let k = shortfall_cdus.min(layouts.len());
    let shortfall = (0..k).map(|i| i * layouts.len() / k.max(1)).collect();
    FaultPlan {
        injections,
        shortfall,
        shortfall_at_s,
    }
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// The fewest CDUs whose hosts add up to `want`, taking the smallest
/// CDUs (every host of a CDU in shortfall is capped).
pub fn cdus_for_hosts(layouts: &[CduLayout], want: usize) -> usize {
    let mut sizes: Vec<usize> = layouts.iter().map(|l| l.host_ids.len()).collect();
    sizes.sort_unstable();
    let mut sum = 0;
    for (i, s) in sizes.iter().enumerate() {
        sum += s;
        if sum >= want {
            return i + 1;
        }
    }
    layouts.len()
}

/// The scenario (plant-scenario/1) of CDU `c`'s hall for a run of
/// `duration_s` at `ambient_c` outdoors.
pub fn scenario_toml(
    c: usize,
    l: &CduLayout,
    plan: &FaultPlan,
    duration_s: u64,
    ambient_c: f64,
) -> String {
    let d = duration_s + SCENARIO_SLACK_S;
    let mut s = format!(
        "format = \"plant-scenario/1\"\n\
         description = \"fleet {}: {} racks of {} hosts, full load at {ambient_c} °C\"\n\
         duration_s = {d}\nseed = {}\n\
         [site]\nracks = {}\nhosts_per_rack = {}\ngpus_per_host = {GPUS_PER_HOST}\n\
         [ambient]\npoints = [[0, {ambient_c:.1}], [{d}, {ambient_c:.1}]]\n\
         [load]\nall = [[0, 1.0], [{d}, 1.0]]\n",
        l.name,
        l.racks,
        l.hosts_per_rack,
        11 + c,
        l.racks,
        l.hosts_per_rack
    );
    for x in plan.injections.iter().filter(|x| x.cdu == c) {
        s.push_str(&format!(
            "[[fault]]\nat_s = {}\nkind = \"gpu_fail\"\ntarget = \"{}.{}.{}\"\n",
            x.at_s,
            x.host / l.hosts_per_rack,
            x.host % l.hosts_per_rack,
            x.gpu
        ));
    }
    if plan.shortfall.contains(&c) {
        s.push_str(&format!(
            "[[fault]]\nat_s = 0\nkind = \"pump_seized\"\ntarget = \"B\"\n\
             [[fault]]\nat_s = {}\nkind = \"pump_trip\"\ntarget = \"A\"\n",
            plan.shortfall_at_s
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_split_evenly_into_racks_the_controller_holds() {
        let l = plan(1000, 16).unwrap();
        assert_eq!(l.iter().map(|c| c.host_ids.len()).sum::<usize>(), 1000);
        for c in &l {
            assert_eq!(c.racks * c.hosts_per_rack, c.host_ids.len());
            assert!(c.racks <= max_racks() && c.host_ids.len() <= 64, "{c:?}");
        }
        assert_eq!(max_racks(), 4, "the simulated board's leak ropes");
        assert_eq!((l[0].racks, l[0].hosts_per_rack), (3, 21));
        assert_eq!((l[15].racks, l[15].hosts_per_rack), (2, 31));
        assert_eq!(l[15].host_ids.len(), 62);
        assert_eq!(l[1].host_ids[22], "c2r1h1");
        let max = cooling_core::MAX_HOSTS;
        let e = plan(4 * max + 4, 4).unwrap_err();
        assert!(
            e.contains(&format!("{} hosts", max + 1)) && e.contains("--cdus 5"),
            "{e}"
        );
        let eight = plan(1000, 8).unwrap();
        assert_eq!((eight[0].racks, eight[0].hosts_per_rack), (1, 125));
        assert!(plan(3, 4).is_err());
        assert!(plan(0, 1).is_err());
    }

    #[test]
    fn failures_are_spread_over_hosts_and_times() {
        let l = plan(40, 2).unwrap();
        let p = faults(&l, 8, (5, 40), 1, 5);
        assert_eq!(p.injections.len(), 8);
        let mut hosts: Vec<_> = p.injections.iter().map(|x| (x.cdu, x.host)).collect();
        hosts.sort();
        hosts.dedup();
        assert_eq!(hosts.len(), 8, "one GPU per host");
        assert!(p.injections.iter().all(|x| (5..=40).contains(&x.at_s)));
        assert_eq!(p.injections.first().unwrap().at_s, 5);
        assert_eq!(p.injections.last().unwrap().at_s, 40);
        assert_eq!(cdus_for_hosts(&plan(1000, 16).unwrap(), 128), 3);
        let sc = scenario_toml(0, &l[0], &p, 60, 40.0);
        let s = loopwarden_twin::scenario::Scenario::from_toml(&sc, "fleet.toml").unwrap();
        assert_eq!(s.site.racks * s.site.hosts_per_rack, 20);
        assert_eq!(
            s.faults.len(),
            p.injections.iter().filter(|x| x.cdu == 0).count() + 2
        );
    }
}
