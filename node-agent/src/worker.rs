//! A thread per GPU, so a GPU call that hangs stalls nothing else.
//!
//! NVML calls block, and on a sick GPU some never return. Each GPU's
//! device lives on its own OS thread; the agent sends it one request at a
//! time and waits at most a deadline. A call that misses the deadline is
//! reported as [`GpuError::Timeout`]; while that call is still running,
//! new requests for the same GPU fail at once instead of queueing behind it
//! (a queued limit would otherwise be applied late, when nobody waits).
//! The other GPUs' threads are untouched, so they keep being sampled on
//! time.
//!
//! Glossary:
//! - *deadline*: the longest the agent waits for one GPU call.
//! - *busy*: a worker with a call in progress, marked by the caller before
//!   the call is handed over and cleared by the worker when it is done.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use loopwarden_protocol::Watts;
use tokio::sync::oneshot;

use crate::gpu::{GpuDevice, GpuError, GpuInfo, GpuSample};

enum Request {
    Describe,
    Sample,
    SetLimit(Watts),
    ReadLimit,
    Reprobe,
}

enum Reply {
    Info(Result<GpuInfo, GpuError>),
    Sample(Result<GpuSample, GpuError>),
    Done(Result<(), GpuError>),
    Limit(Result<Watts, GpuError>),
}

struct Job {
    request: Request,
    reply: oneshot::Sender<Reply>,
}

/// The worker of one GPU.
pub struct Worker {
    index: u8,
    jobs: std::sync::mpsc::Sender<Job>,
    /// When the call in progress was handed over; `None` when idle.
    busy_since: Arc<Mutex<Option<Instant>>>,
}

impl Worker {
    /// Starts the thread that owns `device`.
    pub fn spawn(index: u8, mut device: Box<dyn GpuDevice>) -> std::io::Result<Self> {
        let (jobs, rx) = std::sync::mpsc::channel::<Job>();
        let busy_since = Arc::new(Mutex::new(None));
        let busy = busy_since.clone();
        std::thread::Builder::new()
            .name(format!("gpu-{index}"))
            .spawn(move || {
                // Clears the busy mark however a call ends, a panic included.
                struct Done(Arc<Mutex<Option<Instant>>>);
                impl Drop for Done {
                    fn drop(&mut self) {
                        if let Ok(mut b) = self.0.lock() {
                            *b = None;
                        }
                    }
                }
                for job in rx {
                    let done = Done(busy.clone());
                    let reply = match job.request {
                        Request::Describe => Reply::Info(device.describe()),
                        Request::Sample => Reply::Sample(device.sample()),
                        Request::SetLimit(w) => Reply::Done(device.set_power_limit(w)),
                        Request::ReadLimit => Reply::Limit(device.power_limit()),
                        Request::Reprobe => {
                            device.reprobe();
                            Reply::Done(Ok(()))
                        }
                    };
                    drop(done);
                    // The caller may have given up; that is fine.
                    let _ = job.reply.send(reply);
                }
            })?;
        Ok(Self {
            index,
            jobs,
            busy_since,
        })
    }

    /// The GPU's index.
    pub fn index(&self) -> u8 {
        self.index
    }

    /// Whether a call has been in progress for longer than `deadline`.
    pub fn is_stuck(&self, deadline: Duration) -> bool {
        self.busy_since
            .lock()
            .expect("worker clock")
            .is_some_and(|t| t.elapsed() > deadline)
    }

    async fn call(&self, request: Request, deadline: Duration) -> Result<Reply, GpuError> {
        {
            let mut busy = self.busy_since.lock().expect("worker clock");
            if busy.is_some() {
                // The last call missed its deadline and is still running.
                return Err(GpuError::Timeout);
            }
            *busy = Some(Instant::now());
        }
        let (tx, rx) = oneshot::channel();
        if self.jobs.send(Job { request, reply: tx }).is_err() {
            *self.busy_since.lock().expect("worker clock") = None;
            return Err(GpuError::Failed {
                what: "GPU worker",
                detail: "the worker thread has ended".into(),
            });
        }
        match tokio::time::timeout(deadline, rx).await {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(_)) => Err(GpuError::Failed {
                what: "GPU worker",
                detail: "the worker thread ended during the call".into(),
            }),
            Err(_) => Err(GpuError::Timeout),
        }
    }

    /// The GPU's identity and power range.
    pub async fn describe(&self, deadline: Duration) -> Result<GpuInfo, GpuError> {
        match self.call(Request::Describe, deadline).await? {
            Reply::Info(r) => r,
            _ => unreachable!("a describe request gets an info reply"),
        }
    }

    /// One sample.
    pub async fn sample(&self, deadline: Duration) -> Result<GpuSample, GpuError> {
        match self.call(Request::Sample, deadline).await? {
            Reply::Sample(r) => r,
            _ => unreachable!("a sample request gets a sample reply"),
        }
    }

    /// Sets the power limit.
    pub async fn set_limit(&self, limit: Watts, deadline: Duration) -> Result<(), GpuError> {
        match self.call(Request::SetLimit(limit), deadline).await? {
            Reply::Done(r) => r,
            _ => unreachable!("a set request gets a done reply"),
        }
    }

    /// Reads the power limit back.
    pub async fn read_limit(&self, deadline: Duration) -> Result<Watts, GpuError> {
        match self.call(Request::ReadLimit, deadline).await? {
            Reply::Limit(r) => r,
            _ => unreachable!("a read request gets a limit reply"),
        }
    }

    /// Has the device ask again what answered "not supported"
    /// ([`GpuDevice::reprobe`]).
    pub async fn reprobe(&self, deadline: Duration) -> Result<(), GpuError> {
        match self.call(Request::Reprobe, deadline).await? {
            Reply::Done(r) => r,
            _ => unreachable!("a reprobe request gets a done reply"),
        }
    }
}
