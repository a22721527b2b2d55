//! The whole system played in real time through real brokers and real
//! agents: one test binary, so that its plays, which mostly wait on the
//! wall clock, run side by side on the test harness's threads instead of
//! one after another. Each play starts its own broker (and Slurm) on free
//! loopback ports and asserts on what happened, never on how fast.

mod chiller_trip;
mod cooling_loss;
mod play;
mod shell_faults;
mod slurm_wrapper;
