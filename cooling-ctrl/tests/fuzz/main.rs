//! Fuzz targets of the controller's parsers, run for a time budget (see
//! `tests/fuzz/harness.rs` at the workspace's root): what comes to it from
//! the CDU, the building management system and its operator.
//!
//! - `modbus_client` ([`modbus_client`]): the CDU's answers, mutated, and
//!   the CDU model's register map, mutated, through the Modbus client.
//! - `northbound_write` and `northbound_server` ([`northbound`]): a BMS's
//!   writes through the pure decoder, and mutated request bytes through
//!   the northbound Modbus TCP server on loopback.
//! - `cooling_ctrl_config` ([`config`]): the configuration file, mutated
//!   as TOML, through the controller's loader.

#[path = "../../../tests/fuzz/harness.rs"]
mod harness;
#[path = "../../../tests/fuzz/toml_mutate.rs"]
mod toml_mutate;

mod config;
mod modbus_client;
mod northbound;
