//! The cooling unit's messages: its telemetry ([`CduTelemetry`], with the
//! pumps, the racks and what it learned of the hall), its retained state
//! ([`CduState`]: mode, setpoint, each rack's cooling and leak sensing)
//! and, in a hall of several CDUs, the facility coordinator's offers and
//! plan ([`FacilityState`]).
//!
//! Glossary:
//! - *offer*: what one CDU says facility water at each of a few
//!   temperatures would cost and allow; the coordinator's *plan* picks
//!   one water temperature for the hall.

use super::*;

/// One pump of the CDU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "std", derive(schemars::JsonSchema))]
pub struct PumpStatus {
    /// Running (from its contactor feedback).
    pub running: bool,
    /// Speed commanded.
    pub command: Percent,
    /// Speed reported by its drive, if readable.
    pub feedback: Option<Percent>,
}

/// One rack of the loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "std", derive(schemars::JsonSchema))]
pub struct RackStatus {
    /// The rack.
    pub rack: RackIndex,
    /// Valve position, 0 % closed.
    pub valve: Percent,
    /// Its leak input is active.
    pub leak: bool,
}

/// The loop's measurements and meters (family `telemetry`, QoS 0). A sensor
/// that is lost is `null`, never a stale number.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "std", derive(schemars::JsonSchema))]
pub struct CduTelemetry {
    /// Secondary supply temperature.
    pub supply: Option<Celsius>,
    /// Secondary return temperature.
    pub return_temp: Option<Celsius>,
    /// Supply setpoint in force.
    pub setpoint: Celsius,
    /// Secondary flow.
    pub flow: Option<LitresPerMinute>,
    /// Loop differential pressure.
    pub diff_pressure: Option<KiloPascals>,
    /// Facility water supply temperature.
    pub facility_supply: Option<Celsius>,
    /// Outdoor air temperature, where the site reports it.
    pub ambient: Option<Celsius>,
    /// Reservoir level.
    pub reservoir: Option<Percent>,
    /// Pump A.
    pub pump_a: PumpStatus,
    /// Pump B.
    pub pump_b: PumpStatus,
    /// Racks of the loop.
    #[cfg_attr(
        feature = "std",
        schemars(with = "std::vec::Vec<RackStatus>", length(max = 16))
    )]
    pub racks: Vec<RackStatus, MAX_RACKS>,
    /// IT power (meter).
    pub it_power: Option<Watts>,
    /// Cooling plant power: pumps, fans, chiller (meter).
    pub cooling_power: Option<Watts>,
    /// Facility power (meter).
    pub facility_power: Option<Watts>,
    /// Live PUE from the meters.
    pub pue: Option<Pue>,
    /// What the controller has learned of its hall, and whether it plans
    /// with the configured outdoor temperature (since 2.2; a 2.1 frame
    /// reads as `None`).
    #[serde(default)]
    pub learned: Option<HallEstimates>,
}

/// What a cooling controller has learned of its hall: the figures it
/// estimates from what it measures, each against its configured value,
/// with how well the data pins it down (*confidence*) and how far the
/// optimiser follows it (*trust*). Ratios are in thousandths (1000: as
/// configured).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "std", derive(schemars::JsonSchema))]
pub struct HallEstimates {
    /// The least thermal factor among the hosts learned from (a host's
    /// hottest GPU's resistance to the supply over the configured
    /// model's), in thousandths.
    pub host_factor_min_permille: u16,
    /// The greatest, in thousandths.
    pub host_factor_max_permille: u16,
    /// The host with the greatest factor; `None` before any host has been
    /// learned from.
    pub host_factor_max_host: Option<Ident>,
    /// The least trust among the hosts learned from (what raises the plan
    /// ceiling), in %.
    pub host_trust_min_pct: Percent,
    /// The dry cooler's UA.
    pub dry_cooler_ua: FigureEstimate,
    /// The chiller's COP (its Carnot fraction).
    pub chiller_cop: FigureEstimate,
    /// The CDU pump's power at full speed.
    pub pump_power: FigureEstimate,
    /// The flow per GPU at full pump speed, as estimated.
    pub flow_per_gpu_full_lpm: LitresPerMinute,
    /// The CDU's approach (supply over facility water), as estimated, in
    /// hundredths of a kelvin.
    pub approach_centikelvin: u16,
    /// No outdoor temperature reads: the controller plans with the
    /// configured fallback (an alarm).
    pub outdoor_fallback: bool,
}

/// One plant figure estimated from the facility power meter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "std", derive(schemars::JsonSchema))]
pub struct FigureEstimate {
    /// The estimate over the configured figure, in thousandths.
    pub ratio_permille: u16,
    /// How well the data pins it down, in %.
    pub confidence_pct: Percent,
    /// How far the optimiser follows it, in %.
    pub trust_pct: Percent,
}

/// The state of a rack's cooling, as its hosts need to know it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "std", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum RackCooling {
    /// Cooled as the loop's mode says.
    Normal,
    /// Its valve was closed (a leak): its hosts must drain and power down.
    Lost,
}

/// One rack in the CDU's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "std", derive(schemars::JsonSchema))]
pub struct RackState {
    /// The rack.
    pub rack: RackIndex,
    /// Its cooling.
    pub cooling: RackCooling,
    /// Its leak sensing.
    pub sensing: LeakSensing,
}

/// A rack's leak sensing, as the controller knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "std", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum LeakSensing {
    /// Its rope is supervised and reads.
    Supervised,
    /// Lost: the rope is cut or shorted, or the input lines fail. A leak
    /// on this rack would not be seen.
    Lost,
    /// The site declared the rack without a rope.
    Unprotected,
}

/// The loop's state for its hosts and the facility (family `health`,
/// retained, QoS 1): the cooling context of the health engine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "std", derive(schemars::JsonSchema))]
pub struct CduState {
    /// The controller's mode.
    pub mode: CduMode,
    /// Why it is in that mode.
    pub reason: ReasonCode,
    /// Since when.
    pub since: TimestampMs,
    /// Supply setpoint in force.
    pub setpoint: Celsius,
    /// Secondary supply temperature, if known.
    pub supply: Option<Celsius>,
    /// Flow per GPU, if known.
    pub flow_per_gpu: Option<LitresPerMinute>,
    /// Per-rack cooling.
    #[cfg_attr(
        feature = "std",
        schemars(with = "std::vec::Vec<RackState>", length(max = 16))
    )]
    pub racks: Vec<RackState, MAX_RACKS>,
    /// A hall of several CDUs on one facility water loop: what this CDU
    /// offers the facility coordinator, and the coordinator's plan when
    /// this controller coordinates (since 2.3; a 2.2 frame reads as
    /// `None`).
    #[serde(default)]
    pub facility: Option<FacilityState>,
    /// The controller's signature over the state's topic and frame, as a
    /// command's ([`CommandAuth`]): a host takes a state only from its own
    /// CDU's key (since 2.7; an older frame reads as unsigned, which a
    /// host does not act on).
    #[serde(default)]
    pub auth: CommandAuth,
}

/// Capped steps a [`FacilityOffer`] holds.
pub const OFFER_STEPS: usize = 4;

/// A CDU's part in setting the facility water of a hall of several CDUs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "std", derive(schemars::JsonSchema))]
pub struct FacilityState {
    /// What this CDU can accept; `None` before its first search.
    pub offer: Option<FacilityOffer>,
    /// The plan in force, from this controller when it is the hall's
    /// facility coordinator.
    pub plan: Option<FacilityPlan>,
}

/// What a CDU can accept of the shared facility water, and what warmer
/// water would cost it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "std", derive(schemars::JsonSchema))]
pub struct FacilityOffer {
    /// The warmest facility water at which it holds every GPU at its plan
    /// ceiling at full demand without a cap, pumps at full speed.
    pub accept: Celsius,
    /// The heat it puts into the facility water at `at_water`.
    pub heat: Watts,
    /// The facility water its heat and work are figured at.
    pub at_water: Celsius,
    /// Heat added by each kelvin of warmer facility water (its GPUs'
    /// leakage), W/K.
    pub heat_per_k: Watts,
    /// Its work rate, in hundredths of a GPU at full work.
    pub work_centigpus: u32,
    /// Warmer water than `accept` with caps on its hosts that run hot, in
    /// rising order; water warmer than the last is more than caps hold.
    #[cfg_attr(
        feature = "std",
        schemars(with = "std::vec::Vec<OfferStep>", length(max = 4))
    )]
    pub capped: Vec<OfferStep, OFFER_STEPS>,
}

/// The cost to a CDU of one warmer facility water.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "std", derive(schemars::JsonSchema))]
pub struct OfferStep {
    /// The facility water.
    pub water: Celsius,
    /// The work its caps take there, hundredths of a GPU at full work.
    pub work_lost_centigpus: u32,
    /// The IT power its caps save there.
    pub power_saved: Watts,
}

/// The facility coordinator's plan for the hall.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "std", derive(schemars::JsonSchema))]
pub struct FacilityPlan {
    /// The facility water supply target, for the BMS and every CDU.
    pub water: Celsius,
    /// Chiller stages to run.
    pub chiller_stages: u8,
    /// CDUs whose offers the plan was made from.
    pub offers: u8,
    /// CDUs the plan expects to cap hosts.
    pub capping: u8,
}
