//! Every `loopwarden_cdu_*` metric: its name, type and help text, in the
//! order `docs/cooling.md` lists them.
//!
//! Glossary:
//! - *ratio*: a share from 0 to 1 (Prometheus's base unit for shares).

use loopwarden_bus::prometheus::Metric;

pub const INFO: Metric = Metric::gauge(
    "loopwarden_cdu_info",
    "Always 1; the labels say the controller's site, software version and CDU register map.",
);
pub const STARTED: Metric = Metric::gauge(
    "loopwarden_cdu_start_time_seconds",
    "When the controller started, seconds since the Unix epoch.",
);
pub const LAST_STEP: Metric = Metric::gauge(
    "loopwarden_cdu_last_step_timestamp_seconds",
    "When the control step every other loopwarden_cdu_* series is as of ran, seconds since the Unix epoch; absent before the first step. Alert when it falls behind time() by more than two periods: the control loop is not stepping.",
);
pub const MODE: Metric = Metric::gauge(
    "loopwarden_cdu_mode",
    "The controller's mode as a state set: 1 for the mode it is in (boot, normal, degraded, failsafe), 0 for the others.",
);
pub const MODE_REASON: Metric = Metric::gauge(
    "loopwarden_cdu_mode_reason_code",
    "The reason code of the mode (docs/bus.md's reason codes).",
);
pub const MODE_SINCE: Metric = Metric::gauge(
    "loopwarden_cdu_mode_changed_timestamp_seconds",
    "When the controller entered its mode, seconds since the Unix epoch.",
);
pub const SETPOINT: Metric = Metric::gauge(
    "loopwarden_cdu_supply_setpoint_celsius",
    "The supply temperature setpoint last written to the CDU and taken, as written (held to its register map's range), degrees Celsius.",
);
pub const PUMP_SPEED: Metric = Metric::gauge(
    "loopwarden_cdu_pump_speed_ratio",
    "The pump speed last written to the CDU and taken, as written (held to its register map's range), a share of full speed from 0 to 1.",
);
pub const SUPPLY: Metric = Metric::gauge(
    "loopwarden_cdu_supply_temperature_celsius",
    "Secondary supply (into the racks) temperature as the CDU read it this step, degrees Celsius.",
);
pub const RETURN: Metric = Metric::gauge(
    "loopwarden_cdu_return_temperature_celsius",
    "Secondary return (out of the racks) temperature as the CDU read it this step, degrees Celsius.",
);
pub const FACILITY_SUPPLY: Metric = Metric::gauge(
    "loopwarden_cdu_facility_supply_temperature_celsius",
    "Facility water supply temperature as the CDU read it this step, degrees Celsius.",
);
pub const FLOW: Metric = Metric::gauge(
    "loopwarden_cdu_flow_litres_per_minute",
    "Secondary flow as the CDU read it this step, litres per minute.",
);
pub const DIFF_PRESSURE: Metric = Metric::gauge(
    "loopwarden_cdu_differential_pressure_pascals",
    "Loop differential pressure as the CDU read it this step, pascals.",
);
pub const POWER: Metric = Metric::gauge(
    "loopwarden_cdu_power_watts",
    "The CDU's power meters this step, watts: meter=it (the racks), cooling (the cooling plant), facility (the whole facility).",
);
pub const PUE: Metric = Metric::gauge(
    "loopwarden_cdu_pue",
    "Power usage effectiveness this step: facility power divided by IT power.",
);
pub const SENSOR_FAULT: Metric = Metric::gauge(
    "loopwarden_cdu_sensor_fault",
    "1 while the controller holds the supervised sensor under a fault (lost, implausible, stuck or drifting: it does not believe it), else 0.",
);
pub const PUMP_RUNNING: Metric = Metric::gauge(
    "loopwarden_cdu_pump_running",
    "1 when the pump's contactor feedback says it runs, else 0; absent when the CDU gives no feedback.",
);
pub const PUMP_ON: Metric = Metric::gauge(
    "loopwarden_cdu_pump_commanded_on",
    "1 when the controller commands the pump on, else 0.",
);
pub const PUMP_LEAD: Metric = Metric::gauge(
    "loopwarden_cdu_pump_lead",
    "1 for the lead pump, 0 for the lag pump.",
);
pub const PUMP_FAILED: Metric = Metric::gauge(
    "loopwarden_cdu_pump_failed",
    "1 while the pump is out of service after a trip (an operator puts it back), else 0.",
);
pub const RACK_VALVE_OPEN: Metric = Metric::gauge(
    "loopwarden_cdu_rack_valve_open",
    "1 when the rack's valve is open, 0 when it is shut, as the CDU reads its position, else as the CDU last took the controller's write (a close it did not take reads 1); absent while neither is known.",
);
pub const RACK_COOLING_LOST: Metric = Metric::gauge(
    "loopwarden_cdu_rack_cooling_lost",
    "1 while the rack's cooling is lost (its hosts must drain and power down), else 0.",
);
pub const RACK_LEAK: Metric = Metric::gauge(
    "loopwarden_cdu_rack_leak",
    "1 when a leak input of the rack reads wet this step, else 0; absent while an input that read it wet when it last answered does not answer (neither wet nor dry is known).",
);
pub const RACK_LEAK_LATCHED: Metric = Metric::gauge(
    "loopwarden_cdu_rack_leak_latched",
    "1 while a leak is latched on the rack (its valve stays shut until an operator clears it), else 0; absent while the latched leaks are unknown (loopwarden_cdu_relatch_pending).",
);
pub const RACK_ISOLATION_FAILED: Metric = Metric::gauge(
    "loopwarden_cdu_rack_isolation_failed",
    "1 when isolating the rack failed and both pumps are stopped for it, else 0; absent while the latched leaks are unknown (loopwarden_cdu_relatch_pending).",
);
pub const RELATCH_PENDING: Metric = Metric::gauge(
    "loopwarden_cdu_relatch_pending",
    "1 while the latched leaks are unknown: the latched record was unreadable at start and the racks are not yet relatched from the CDU's valve positions (no valve is written meanwhile), else 0.",
);
pub const HEARTBEAT_HELD: Metric = Metric::gauge(
    "loopwarden_cdu_heartbeat_held",
    "1 while the controller holds the CDU's heartbeat back (does not write it) because a read-back found a safety setting (valves, pumps to run, lead pump) the CDU echoed but does not hold, until one reads it held: the CDU falls back to its own control after its heartbeat timeout meanwhile, and the mode reads degraded (heartbeat-held, 2016, unless a latched leak is the reason: this gauge still reads 1); else 0. Alert on it.",
);
pub const RACK_LEAK_SENSING: Metric = Metric::gauge(
    "loopwarden_cdu_rack_leak_sensing",
    "The rack's leak sensing as a state set: supervised, lost (a rope fault or an unreadable input) or unprotected (declared without a rope).",
);
pub const BEACON: Metric = Metric::gauge(
    "loopwarden_cdu_alarm_beacon",
    "1 while the alarm beacon is on, else 0.",
);
pub const REJECTION_SHORT: Metric = Metric::gauge(
    "loopwarden_cdu_heat_rejection_short",
    "1 while the controller believes heat rejection is short (the supply cannot be held), else 0.",
);
pub const HOST_CAP: Metric = Metric::gauge(
    "loopwarden_cdu_host_cap_watts",
    "The power cap per GPU the controller last sent the host while it caps it, watts.",
);
pub const HOST_IN_FORCE: Metric = Metric::gauge(
    "loopwarden_cdu_host_limit_in_force_watts",
    "The lowest GPU power limit in force on the host, as its last ack of this controller's commands reported, watts.",
);
pub const HOST_HEARD: Metric = Metric::gauge(
    "loopwarden_cdu_host_last_report_timestamp_seconds",
    "When the host's telemetry last reached the controller, seconds since the Unix epoch.",
);
pub const HOSTS_CAPPED: Metric = Metric::gauge(
    "loopwarden_cdu_hosts_capped",
    "Hosts capped now: the cap lease last sent to each is inside its life and was not refused.",
);
pub const PROTECTION_OFF: Metric = Metric::gauge(
    "loopwarden_protection_off",
    "1 for each protection switched off on purpose in the configuration; key names the setting (northbound_writes_any_address, rope_fault_active_high, volatile_latch). Absent while every protection is on.",
);
pub const STEPS: Metric = Metric::counter(
    "loopwarden_cdu_steps_total",
    "Control steps run since the controller started.",
);
pub const STEPS_LATE: Metric = Metric::counter(
    "loopwarden_cdu_steps_late_total",
    "Control steps that took longer than the control period.",
);
pub const MODBUS_UP: Metric = Metric::gauge(
    "loopwarden_cdu_modbus_up",
    "1 while the CDU answers its Modbus reads, else 0.",
);
pub const MODBUS_READS: Metric = Metric::counter(
    "loopwarden_cdu_modbus_reads_total",
    "CDU Modbus reads that answered.",
);
pub const MODBUS_READ_ERRORS: Metric = Metric::counter(
    "loopwarden_cdu_modbus_read_errors_total",
    "CDU Modbus reads that failed, in whole or in part (refused or no answer).",
);
pub const MODBUS_WRITE_ERRORS: Metric = Metric::counter(
    "loopwarden_cdu_modbus_write_errors_total",
    "Control steps in which a CDU Modbus settings write failed.",
);
pub const SETTINGS_LIMITED: Metric = Metric::counter(
    "loopwarden_cdu_settings_limited_total",
    "Setpoint or pump speed writes held to the CDU's register map.",
);
pub const LATCH_WRITE_ERRORS: Metric = Metric::counter(
    "loopwarden_cdu_latch_write_errors_total",
    "Latched records that did not go to flash.",
);
pub const HOST_REPORTS: Metric = Metric::counter(
    "loopwarden_cdu_host_reports_total",
    "Host telemetry frames taken.",
);
pub const HOST_REPORTS_REFUSED: Metric = Metric::counter(
    "loopwarden_cdu_host_reports_refused_total",
    "Host telemetry frames refused as implausible.",
);
pub const HOST_GPUS_LEFT_OUT: Metric = Metric::counter(
    "loopwarden_cdu_host_reports_partial_total",
    "Host telemetry frames taken without some of their GPUs, left out as implausible.",
);
pub const LEASES_SENT: Metric = Metric::counter(
    "loopwarden_cdu_leases_sent_total",
    "Signed cap leases sent to hosts (renewals included, lifts not).",
);
pub const LIFTS_SENT: Metric = Metric::counter(
    "loopwarden_cdu_lifts_sent_total",
    "Short leases at the GPUs' TDP sent to lift a cap.",
);
pub const ACKS: Metric = Metric::counter(
    "loopwarden_cdu_acks_total",
    "Acks of this controller's commands received, by result: ok (ok or clamped) or refused.",
);
pub const ACKS_FOREIGN: Metric = Metric::counter(
    "loopwarden_cdu_acks_foreign_total",
    "Acks naming this controller's commands from hosts not in its host list, dropped unread.",
);
pub const PUBLISHED: Metric = Metric::counter(
    "loopwarden_cdu_published_total",
    "Frames published by the controller, by kind: telemetry, state, event.",
);
pub const PUBLISH_ERRORS: Metric = Metric::counter(
    "loopwarden_cdu_publish_errors_total",
    "Publishes the bus did not take.",
);
pub const EVENTS_DROPPED: Metric = Metric::counter(
    "loopwarden_cdu_core_events_dropped_total",
    "Events the control core could not fit in a step since the start.",
);

pub const ESTIMATE_RATIO: Metric = Metric::gauge(
    "loopwarden_estimate_ratio",
    "The controller's estimate of a plant figure over its configured value (1: as configured), from the facility power meter: figure=dry_cooler_ua (the dry cooler's UA), chiller_cop (the chiller's Carnot fraction), pump_power (the CDU pump's power at full speed).",
);
pub const ESTIMATE_CONFIDENCE: Metric = Metric::gauge(
    "loopwarden_estimate_confidence",
    "How well the data pins the estimate of a plant figure down, 0 to 1 (1 - its standard deviation over the prior's).",
);
pub const ESTIMATE_TRUST: Metric = Metric::gauge(
    "loopwarden_estimate_trust",
    "How far the optimiser follows the estimate of a plant figure instead of its configured value, 0 to 1; never above the confidence, rising at most 1/1800 per second.",
);
pub const HOST_THERMAL_FACTOR: Metric = Metric::gauge(
    "loopwarden_host_thermal_factor",
    "The host's learned thermal factor: its hottest GPU's resistance to the supply over the configured model's (1: as the model; above 1: runs hotter, a fouled cold plate or a hotter GPU).",
);
pub const OUTDOOR_FALLBACK: Metric = Metric::gauge(
    "loopwarden_outdoor_fallback",
    "1 while no outdoor temperature reads (the CDU's sensor, the BMS's write) and the controller plans with the configured fallback ambient_c (an alarm), else 0.",
);

pub const FACILITY_ACCEPT: Metric = Metric::gauge(
    "loopwarden_facility_accept_celsius",
    "A hall of several CDUs: the warmest facility water at which this CDU holds every GPU at its plan ceiling at full demand without a cap, pumps at full speed (its offer to the facility coordinator).",
);
pub const FACILITY_WATER_TARGET: Metric = Metric::gauge(
    "loopwarden_facility_water_target_celsius",
    "A hall of several CDUs: the facility water the coordinator's plan sets, as this CDU follows it.",
);
pub const FACILITY_CHILLER_STAGES: Metric = Metric::gauge(
    "loopwarden_facility_chiller_stages",
    "On the hall's facility coordinator: the chiller stages its plan runs.",
);

/// What the controller has learned of its hall (`crate::estimates`),
/// named apart from `loopwarden_cdu_*`.
#[cfg(test)]
pub const ESTIMATES: &[Metric] = &[
    ESTIMATE_RATIO,
    ESTIMATE_CONFIDENCE,
    ESTIMATE_TRUST,
    HOST_THERMAL_FACTOR,
    OUTDOOR_FALLBACK,
];

/// A hall of several CDUs' facility water.
#[cfg(test)]
pub const FACILITY: &[Metric] = &[
    FACILITY_ACCEPT,
    FACILITY_WATER_TARGET,
    FACILITY_CHILLER_STAGES,
];

/// Readers' requests to resend the logged events, named as the node
/// agent names its own (`docs/node-agent.md` §9.2 lists them).
#[cfg(test)]
pub const RESEND: &[Metric] = &[
    loopwarden_bus::prometheus::RESEND_REQUESTS,
    loopwarden_bus::prometheus::RESEND_FRAMES,
];

/// Every `loopwarden_cdu_*` metric above, for the documentation's test.
#[cfg(test)]
pub const ALL: &[Metric] = &[
    INFO,
    STARTED,
    LAST_STEP,
    MODE,
    MODE_REASON,
    MODE_SINCE,
    SETPOINT,
    PUMP_SPEED,
    SUPPLY,
    RETURN,
    FACILITY_SUPPLY,
    FLOW,
    DIFF_PRESSURE,
    POWER,
    PUE,
    SENSOR_FAULT,
    PUMP_RUNNING,
    PUMP_ON,
    PUMP_LEAD,
    PUMP_FAILED,
    RACK_VALVE_OPEN,
    RACK_COOLING_LOST,
    RACK_LEAK,
    RACK_LEAK_LATCHED,
    RACK_ISOLATION_FAILED,
    RELATCH_PENDING,
    HEARTBEAT_HELD,
    RACK_LEAK_SENSING,
    BEACON,
    REJECTION_SHORT,
    HOST_CAP,
    HOST_IN_FORCE,
    HOST_HEARD,
    HOSTS_CAPPED,
    PROTECTION_OFF,
    STEPS,
    STEPS_LATE,
    MODBUS_UP,
    MODBUS_READS,
    MODBUS_READ_ERRORS,
    MODBUS_WRITE_ERRORS,
    SETTINGS_LIMITED,
    LATCH_WRITE_ERRORS,
    HOST_REPORTS,
    HOST_REPORTS_REFUSED,
    HOST_GPUS_LEFT_OUT,
    LEASES_SENT,
    LIFTS_SENT,
    ACKS,
    ACKS_FOREIGN,
    PUBLISHED,
    PUBLISH_ERRORS,
    EVENTS_DROPPED,
];
