//! # loopwarden-sparkplug: the Loopwarden bus as Sparkplug B
//!
//! SCADA packages, Ignition and historians speak Sparkplug B (Eclipse
//! Sparkplug 3.0). This bridge reads one site's frames from the Loopwarden
//! bus and publishes them as one Sparkplug *edge node* (group id: the
//! site) with one *device* per CDU and per host, beside the JSON mirror,
//! which stays as it is. The agents know nothing of it and carry no
//! protobuf code. `docs/sparkplug.md` is the integrator's guide.
//!
//! - [`payload`]: the Sparkplug B protobuf messages the bridge writes and
//!   reads, and its metric values;
//! - [`device`]: which metrics a host and a CDU have, from their latest
//!   telemetry, health, state and presence (pure);
//! - [`bridge`]: the core, `Bridge::step(now, input) -> Vec<Publish>`:
//!   births, data, deaths, sequence numbers, rebirth (pure);
//! - [`shell`]: the two MQTT connections, the tick and the signals;
//! - [`cli`]: `lw-sparkplug`'s flags.
//!
//! Why `prost`: Sparkplug B is protobuf, and a payload nests metrics,
//! `oneof` values and property sets, and the bridge must also *read*
//! commands (NCMD). `prost` is the Rust protobuf crate the field uses
//! (tokio's); its derive lets the few messages of the schema be written
//! out here by hand with their field numbers, so there is no build
//! script, no `protoc` and no generated file. A hand-written encoder of
//! the same subset would be shorter than `prost`, but a decoder for
//! commands as well, with unknown fields skipped, is where such code goes
//! wrong; a golden-byte test (in [`payload`]) keeps the field numbers
//! honest either way.
//!
//! Glossary:
//! - *edge node*: the bridge, as Sparkplug sees it; its NBIRTH and NDEATH
//!   frame a *session*.
//! - *device*: a host or CDU under the edge node (DBIRTH, DDATA, DDEATH).
//! - *bdSeq*: the birth/death number that ties an NBIRTH to the NDEATH
//!   the broker holds as the bridge's MQTT will.
//! - *seq*: the edge node's message counter, 0 to 255, wrapping.
//! - *rebirth*: a host application's request (NCMD) for every birth again.

#![warn(missing_docs)]

pub mod bridge;
pub mod cli;
pub mod device;
pub mod payload;
pub mod shell;
