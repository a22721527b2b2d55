//! The simulated hall's GPUs behind the node agent's `GpuSource`.
//!
//! In the twin, each host's agent reads its own GPUs out of the shared
//! [`Hall`] (whose plant couples them to the coolant, the pumps and the
//! other racks) and puts its caps on them, the way it reads and caps real
//! GPUs through NVML. A GPU the plant shuts down or the scenario fails is
//! lost to the agent, with XID 79, as a GPU that falls off the bus is.
//!
//! The GPUs answer from memory (the hall's state, under its lock), so the
//! agent calls them without a thread per GPU. XIDs come from a watch that
//! looks at the hall every [`XID_POLL`]: a source of its own
//! ([`HallSource::new`]) or one watch for every host of the hall
//! ([`HallXidWatch`], when many agents share a process).
//!
//! Glossary:
//! - *host slot*: which host of the hall this agent is (rack-major order).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use loopwarden_protocol::{
    GpuFlags, MegaHertz, Percent, ThrottleReasons, Unsupported, Watts, WholeCelsius,
};
use loopwarden_twin::hall::Hall;

use crate::gpu::{GpuDevice, GpuError, GpuInfo, GpuSample, GpuSource, XidEvent, XidReport};

/// How often a watch looks for GPUs the hall lost.
pub const XID_POLL: Duration = Duration::from_millis(50);

/// One host's GPUs in a shared hall.
pub struct HallSource {
    hall: Arc<Mutex<Hall>>,
    host: usize,
    first: usize,
    count: usize,
    stop: Arc<AtomicBool>,
    /// The hall's shared watch, if the source uses one.
    shared: Option<Arc<WatchInner>>,
}

impl HallSource {
    /// Host `host` (rack-major) of `hall`, with an XID watch of its own.
    pub fn new(hall: Arc<Mutex<Hall>>, host: usize) -> Self {
        let per_host = hall.lock().expect("hall").plant().site().gpus_per_host;
        Self {
            hall,
            host,
            first: host * per_host,
            count: per_host,
            stop: Arc::new(AtomicBool::new(false)),
            shared: None,
        }
    }
}

/// One XID watch for every host of a hall: a thread that looks at the
/// hall every [`XID_POLL`] and tells each host's agent of its GPUs the
/// hall lost, with XID 79. It ends when the watch and every source made
/// from it are dropped.
pub struct HallXidWatch {
    inner: Arc<WatchInner>,
}

struct WatchInner {
    hall: Arc<Mutex<Hall>>,
    per_host: usize,
    /// Each host's sink, once its agent watches.
    sinks: Mutex<Vec<Option<crate::xid_queue::XidSink>>>,
}

impl HallXidWatch {
    /// Starts the watch of `hall`, on a thread named `name`.
    pub fn start(hall: Arc<Mutex<Hall>>, name: &str) -> std::io::Result<Self> {
        let (hosts, per_host) = {
            let h = hall.lock().expect("hall");
            let s = h.plant().site();
            (s.racks * s.hosts_per_rack, s.gpus_per_host)
        };
        let inner = Arc::new(WatchInner {
            hall,
            per_host,
            sinks: Mutex::new(vec![None; hosts]),
        });
        let weak = Arc::downgrade(&inner);
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || watch_shared(weak))?;
        Ok(Self { inner })
    }

    /// Host `host` (rack-major) of the hall, its XIDs from this watch.
    pub fn source(&self, host: usize) -> HallSource {
        let per_host = self.inner.per_host;
        HallSource {
            hall: self.inner.hall.clone(),
            host,
            first: host * per_host,
            count: per_host,
            stop: Arc::new(AtomicBool::new(false)),
            shared: Some(self.inner.clone()),
        }
    }
}

/// The shared watch's loop: every GPU of the hall, until nothing holds
/// the watch.
fn watch_shared(inner: Weak<WatchInner>) {
    let mut lost: Vec<bool> = Vec::new();
    while let Some(w) = inner.upgrade() {
        let newly: Vec<usize> = {
            let h = w.hall.lock().expect("hall");
            let gpus = h.gpus();
            lost.resize(gpus.len(), false);
            gpus.iter()
                .zip(lost.iter_mut())
                .enumerate()
                .filter_map(|(i, (g, was))| {
                    (g.shut_down && !std::mem::replace(was, true)).then_some(i)
                })
                .collect()
        };
        if !newly.is_empty() {
            let mut sinks = w.sinks.lock().expect("sinks");
            for i in newly {
                let (host, gpu) = (i / w.per_host, i % w.per_host);
                let Some(slot) = sinks.get_mut(host) else {
                    continue;
                };
                let sent = slot.as_ref().map(|s| {
                    s.send(XidEvent::Xid(XidReport {
                        gpu: gpu as u8,
                        xid: 79,
                    }))
                });
                if let Some(Err(_)) = sent {
                    // Its agent is gone.
                    *slot = None;
                }
            }
        }
        drop(w);
        std::thread::sleep(XID_POLL);
    }
}

impl Drop for HallSource {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl GpuSource for HallSource {
    fn devices(&mut self) -> Result<Vec<Box<dyn GpuDevice>>, GpuError> {
        Ok((0..self.count)
            .map(|k| {
                Box::new(HallGpu {
                    hall: self.hall.clone(),
                    index: self.first + k,
                }) as Box<dyn GpuDevice>
            })
            .collect())
    }

    fn watch_xids(
        &mut self,
        sink: crate::xid_queue::XidSink,
    ) -> Result<Vec<(u8, GpuError)>, GpuError> {
        if let Some(w) = &self.shared {
            if let Some(slot) = w.sinks.lock().expect("sinks").get_mut(self.host) {
                *slot = Some(sink);
            }
            return Ok(Vec::new());
        }
        let hall = self.hall.clone();
        let (first, count) = (self.first, self.count);
        let stop = self.stop.clone();
        std::thread::Builder::new()
            .name("hall-xid".into())
            .spawn(move || {
                let mut lost = vec![false; count];
                while !stop.load(Ordering::Relaxed) {
                    {
                        let h = hall.lock().expect("hall");
                        for (k, was) in lost.iter_mut().enumerate() {
                            let now = h.gpus()[first + k].shut_down;
                            if now && !*was {
                                *was = true;
                                let _ = sink.send(XidEvent::Xid(XidReport {
                                    gpu: k as u8,
                                    xid: 79,
                                }));
                            }
                        }
                    }
                    std::thread::sleep(XID_POLL);
                }
            })
            .map_err(|e| GpuError::Failed {
                what: "hall XID thread",
                detail: e.to_string(),
            })?;
        Ok(Vec::new())
    }
}

/// GPU `i`'s enforced power limit: its host's cap, else its ceiling
/// (the hall's GPUs have no administrator's limit: their TDP).
fn enforced_limit(h: &Hall, i: usize) -> Watts {
    let tdp = h.plant().site().gpu.tdp_w;
    Watts(h.cap(i).unwrap_or(tdp).round() as u32)
}

/// One GPU of the hall.
struct HallGpu {
    hall: Arc<Mutex<Hall>>,
    index: usize,
}

impl GpuDevice for HallGpu {
    fn describe(&mut self) -> Result<GpuInfo, GpuError> {
        let h = self.hall.lock().expect("hall");
        let g = &h.plant().site().gpu;
        Ok(GpuInfo {
            name: "Loopwarden hall GPU".into(),
            uuid: format!("GPU-hall-{:04}", self.index),
            default_limit: Watts(g.tdp_w as u32),
            min_limit: Watts(g.min_cap_w as u32),
            max_limit: Watts(g.tdp_w as u32),
            persistence: Some(true),
        })
    }

    fn sample(&mut self) -> Result<GpuSample, GpuError> {
        let h = self.hall.lock().expect("hall");
        let s = h.gpus()[self.index];
        if s.shut_down {
            return Err(GpuError::Lost);
        }
        let idle = s.demand < 0.05;
        let capped = !s.slowdown && s.work + 1e-6 < s.demand;
        let throttle = ThrottleReasons::empty()
            .with(ThrottleReasons::IDLE, idle)
            .with(ThrottleReasons::SW_POWER_CAP, capped)
            .with(ThrottleReasons::HW_THERMAL_SLOWDOWN, s.slowdown);
        let ratio = if s.demand > 0.0 {
            (s.work / s.demand).clamp(0.0, 1.0)
        } else {
            1.0
        };
        let sm = if idle { 345.0 } else { 1980.0 * ratio.cbrt() };
        let mem = s.t_in + 0.8 * (s.t_j - s.t_in);
        // The enforced limit is the one set (a cap, else the GPU's
        // ceiling), from the moment it is set, as NVML reports it; a
        // thermal slowdown shows in the throttle reasons, not here.
        let limit = enforced_limit(&h, self.index);
        Ok(GpuSample {
            flags: GpuFlags::ECC_ENABLED,
            unsupported: Unsupported::empty(),
            temp: WholeCelsius(s.t_j.round().clamp(0.0, 255.0) as u8),
            mem_temp: WholeCelsius(mem.round().clamp(0.0, 255.0) as u8),
            power: Watts(s.power.round() as u32),
            energy_mj: 0,
            power_limit: limit,
            sm_clock: MegaHertz(sm.round() as u16),
            mem_clock: MegaHertz(2619),
            util: Percent::new((s.demand * 100.0).round() as u8).unwrap_or(Percent::FULL),
            throttle,
            ..GpuSample::default()
        })
    }

    fn set_power_limit(&mut self, limit: Watts) -> Result<(), GpuError> {
        let mut h = self.hall.lock().expect("hall");
        let g = h.plant().site().gpu.clone();
        let w = f64::from(limit.0);
        if w < g.min_cap_w || w > g.tdp_w {
            return Err(GpuError::InvalidArgument);
        }
        h.set_cap(self.index, (w < g.tdp_w).then_some(w));
        Ok(())
    }

    fn power_limit(&mut self) -> Result<Watts, GpuError> {
        let h = self.hall.lock().expect("hall");
        Ok(enforced_limit(&h, self.index))
    }

    /// The hall's state in memory, under a lock held only for a step.
    fn answers_in_memory(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use loopwarden_boards::modbus_map::RegisterMap;
    use loopwarden_boards::pins::PinMap;
    use loopwarden_twin::pins::SimLines;
    use loopwarden_twin::scenario::Scenario;
    use loopwarden_twin::sim_cdu::SimCdu;

    fn hall(extra: &str) -> Arc<Mutex<Hall>> {
        let text = format!(
            "format = \"plant-scenario/1\"\ndescription = \"t\"\nduration_s = 3600\nseed = 1\n\
             [site]\nracks = 1\nhosts_per_rack = 2\n[ambient]\npoints = [[0, 20.0]]\n\
             [load]\nall = [[0, 0.95]]\n{extra}"
        );
        let s = Scenario::from_toml(&text, "t.toml").unwrap();
        let cdu = SimCdu::new(
            RegisterMap::sim_cdu(),
            &[
                ("supply_setpoint", 32.0),
                ("pump_speed", 100.0),
                ("valves_open", 1.0),
            ],
        )
        .unwrap();
        Arc::new(Mutex::new(Hall::new(
            s,
            cdu,
            SimLines::new(),
            PinMap::sim_controller(),
        )))
    }

    fn steps(h: &Arc<Mutex<Hall>>, n: usize) {
        for _ in 0..n {
            h.lock().unwrap().step(1.0).unwrap();
        }
    }

    #[test]
    fn a_host_reads_its_own_gpus_and_its_caps_act_on_the_plant() {
        let h = hall("");
        let mut src = HallSource::new(h.clone(), 1);
        let mut gpus = src.devices().unwrap();
        assert_eq!(gpus.len(), 8);
        assert_eq!(
            gpus[0].describe().unwrap().uuid,
            "GPU-hall-0008",
            "host 1 starts at GPU 8"
        );
        steps(&h, 300);
        let before = gpus[3].sample().unwrap();
        assert!(before.power.0 > 600, "{before:?}");
        gpus[3].set_power_limit(Watts(400)).unwrap();
        assert_eq!(gpus[3].power_limit().unwrap(), Watts(400));
        steps(&h, 300);
        let after = gpus[3].sample().unwrap();
        assert_eq!(after.power, Watts(400));
        assert!(after.throttle.contains(ThrottleReasons::SW_POWER_CAP));
        assert!(after.temp.0 + 5 < before.temp.0, "cooler under the cap");
        assert_eq!(
            gpus[3].set_power_limit(Watts(150)),
            Err(GpuError::InvalidArgument)
        );
    }

    #[test]
    fn the_enforced_limit_is_the_one_set_from_the_moment_it_is_set_even_in_a_slowdown() {
        // No pump runs: the rack heats to its thermal slowdown.
        let h = hall("[[fault]]\nat_s = 0\nkind = \"pump_trip\"\ntarget = \"A\"\n");
        let mut gpus = HallSource::new(h.clone(), 0).devices().unwrap();
        let mut slow = None;
        for _ in 0..600 {
            steps(&h, 1);
            let s = gpus[0].sample().unwrap();
            if s.throttle.contains(ThrottleReasons::HW_THERMAL_SLOWDOWN) {
                slow = Some(s);
                break;
            }
        }
        let slow = slow.expect("a slowdown without flow");
        assert_eq!(slow.power_limit, Watts(700), "uncapped: its TDP");
        assert!(slow.power.0 < 700, "{slow:?}");
        // A cap is the enforced limit at once, before the hall steps.
        gpus[1].set_power_limit(Watts(300)).unwrap();
        assert_eq!(gpus[1].sample().unwrap().power_limit, Watts(300));
        gpus[1].set_power_limit(Watts(700)).unwrap();
        assert_eq!(gpus[1].sample().unwrap().power_limit, Watts(700));
    }

    #[test]
    fn a_failed_gpu_is_lost_with_xid_79() {
        let h = hall("[[fault]]\nat_s = 5\nkind = \"gpu_fail\"\ntarget = \"0.0.2\"\n");
        let mut src = HallSource::new(h.clone(), 0);
        let (tx, rx) = crate::xid_queue::xid_queue(16);
        src.watch_xids(tx).unwrap();
        let mut gpus = src.devices().unwrap();
        steps(&h, 10);
        let x = rx.recv_timeout(Duration::from_secs(5)).expect("an XID");
        assert_eq!(x, XidEvent::Xid(XidReport { gpu: 2, xid: 79 }));
        assert_eq!(gpus[2].sample(), Err(GpuError::Lost));
        assert!(gpus[1].sample().is_ok());
    }

    #[test]
    fn one_watch_tells_each_host_of_its_own_lost_gpus() {
        let h = hall("[[fault]]\nat_s = 5\nkind = \"gpu_fail\"\ntarget = \"0.1.6\"\n");
        let watch = HallXidWatch::start(h.clone(), "hall-xid").unwrap();
        let mut queues = Vec::new();
        for host in 0..2 {
            let mut src = watch.source(host);
            assert!(src.devices().unwrap()[0].answers_in_memory());
            let (tx, rx) = crate::xid_queue::xid_queue(16);
            src.watch_xids(tx).unwrap();
            queues.push((src, rx));
        }
        steps(&h, 10);
        let x = queues[1]
            .1
            .recv_timeout(Duration::from_secs(5))
            .expect("an XID");
        assert_eq!(x, XidEvent::Xid(XidReport { gpu: 6, xid: 79 }));
        assert!(queues[0]
            .1
            .recv_timeout(Duration::from_millis(300))
            .is_none());
    }
}
