//! The JSON form of frames, for facility subscribers (BMS, DCIM, Telegraf,
//! Home Assistant) and for people, and a JSON Schema per message kind.
//!
//! ```json
//! {"protocol":"2.10","sender":{"role":"host","id":"h07"},"seq":42,"time_ms":1764450000000,
//!  "kind":"host_telemetry","body":{...}}
//! ```
//!
//! Units are plain numbers in their natural unit (°C, W, L/min, %, kPa, ms),
//! flag sets are lists of names and reasons are names (`xid-79`). A name
//! this reader does not know is refused naming it and its field
//! ([`JsonError::UnknownName`]).
//! The committed schemas live in `docs/schemas/<kind>.json`.

use std::format;
use std::string::{String, ToString};
use std::vec::Vec;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::frame::{Frame, Message, MessageKind, Version, PROTOCOL};
use crate::ids::NodeId;
use crate::message::{
    Ack, CapLease, CduState, CduTelemetry, Event, GpuFlags, HostHealth, HostTelemetry, Online,
    QuarantineRelease, ResendReport, ResendRequest, ThrottleReasons, Unsupported,
};
use crate::reason::ReasonCode;
use crate::units::TimestampMs;

#[derive(Serialize, Deserialize)]
struct JsonFrame {
    protocol: String,
    sender: NodeId,
    seq: u32,
    time_ms: TimestampMs,
    #[serde(flatten)]
    message: Message,
}

/// The envelope of one kind, for its schema.
#[derive(JsonSchema)]
#[allow(dead_code)]
struct Envelope<T> {
    /// The sender's protocol version, `major.minor`.
    protocol: String,
    /// Who sent it.
    sender: NodeId,
    /// The sender's sequence number.
    seq: u32,
    /// When it was sent, ms since the Unix epoch (or since boot, see `online`).
    time_ms: TimestampMs,
    /// The message kind.
    kind: String,
    /// The message.
    body: T,
}

/// Why JSON was refused as a frame.
#[derive(Debug)]
#[non_exhaustive]
pub enum JsonError {
    /// Not valid JSON for any message, or a value out of range.
    Invalid(serde_json::Error),
    /// The `protocol` field is not a version this reader speaks.
    UnsupportedVersion(String),
    /// A reason or flag name this reader does not know: a newer minor's,
    /// or a typo.
    UnknownName {
        /// `"reason"` or `"flag"`.
        what: &'static str,
        /// The name as the JSON has it.
        name: String,
        /// Where: `body.reason`, `body.gpus[0].flags`.
        field: String,
        /// The frame's `protocol`, as it has it.
        protocol: String,
    },
}

impl core::fmt::Display for JsonError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            JsonError::Invalid(e) => write!(f, "invalid frame JSON: {e}"),
            JsonError::UnsupportedVersion(v) => {
                write!(
                    f,
                    "protocol version {v:?} is not supported (this reader speaks {PROTOCOL})"
                )
            }
            JsonError::UnknownName {
                what,
                name,
                field,
                protocol,
            } => write!(
                f,
                "unknown {what} {name:?} in {field}: this reader speaks {PROTOCOL}, the frame {protocol}"
            ),
        }
    }
}

impl std::error::Error for JsonError {}

/// `major.minor` as the protocol writes it: decimal digits only, with no
/// sign and no leading zero (`"2.09"` or `"+2.9"` is not `2.9`).
fn parse_version(s: &str) -> Option<Version> {
    let (major, minor) = s.split_once('.')?;
    Some(Version {
        major: version_part(major)?,
        minor: version_part(minor)?,
    })
}

fn version_part(s: &str) -> Option<u8> {
    let canonical = s.bytes().all(|b| b.is_ascii_digit()) && (s == "0" || !s.starts_with('0'));
    if canonical {
        s.parse().ok()
    } else {
        None
    }
}

impl Frame {
    /// The frame as one line of JSON.
    pub fn to_json(&self) -> String {
        let json = JsonFrame {
            protocol: PROTOCOL.to_string(),
            sender: self.sender.clone(),
            seq: self.seq,
            time_ms: self.time,
            message: self.message.clone(),
        };
        // Every field serialises infallibly: no maps with non-string keys, no
        // non-finite floats (units are integers underneath).
        serde_json::to_string(&json).expect("frame JSON serialisation cannot fail")
    }

    /// A frame from its JSON form.
    pub fn from_json(s: &str) -> Result<Frame, JsonError> {
        let json: JsonFrame = serde_json::from_str(s).map_err(|e| refusal(s, e))?;
        match parse_version(&json.protocol) {
            Some(v) if v.major == PROTOCOL.major => {}
            _ => return Err(JsonError::UnsupportedVersion(json.protocol)),
        }
        Ok(Frame {
            sender: json.sender,
            seq: json.seq,
            time: json.time_ms,
            message: json.message,
        })
    }
}

/// Why `s` was refused: serde_json says an unknown reason or flag name
/// (see [`crate::reason`], [`crate::flags`]) but not where it is, so it is
/// found in the body: in a reason or flag field whose own parser refuses
/// it, named with that field. A frame of another major is
/// refused for its version; anything else as serde_json says it.
fn refusal(s: &str, e: serde_json::Error) -> JsonError {
    let said = e.to_string();
    if !said.starts_with("unknown reason ") && !said.starts_with("unknown flag ") {
        return JsonError::Invalid(e);
    }
    let Ok(value) = serde_json::from_str::<serde_json::Value>(s) else {
        return JsonError::Invalid(e);
    };
    let protocol = match value.get("protocol").and_then(|p| p.as_str()) {
        Some(p) if parse_version(p).is_some_and(|v| v.major == PROTOCOL.major) => p.to_string(),
        Some(p) => return JsonError::UnsupportedVersion(p.to_string()),
        None => return JsonError::Invalid(e),
    };
    let Some(body) = value.get("body") else {
        return JsonError::Invalid(e);
    };
    let Some((what, name, field)) = find_name(body, &said) else {
        return JsonError::Invalid(e);
    };
    JsonError::UnknownName {
        what,
        name,
        field,
        protocol,
    }
}

/// Whether a field's parser knows a name.
type Knows = fn(&str) -> bool;

/// The fields whose strings are names: each field's key, what its names
/// are (a `reason` is one name; a flag set, a list of names) and whether
/// its own parser knows a name.
const NAME_FIELDS: [(&str, &str, Knows); 4] = [
    ("reason", "reason", |n| ReasonCode::parse(n).is_some()),
    ("flags", "flag", |n| GpuFlags::from_name(n).is_some()),
    ("unsupported", "flag", |n| {
        Unsupported::from_name(n).is_some()
    }),
    ("throttle", "flag", |n| {
        ThrottleReasons::from_name(n).is_some()
    }),
];

/// One step of the path from the body to a field.
enum Step<'v> {
    /// Into an object's field.
    Key(&'v str),
    /// Into a list's item.
    Index(usize),
}

/// An unknown name found: what it is, the name, and the steps to its
/// field, innermost first (pushed on the way back up).
struct Found<'v> {
    what: &'static str,
    name: &'v str,
    steps: Vec<Step<'v>>,
}

impl Found<'_> {
    /// The field's path from `root`: `body.gpus[0].flags`.
    fn field(&self, root: &str) -> String {
        let mut at = root.to_string();
        for step in self.steps.iter().rev() {
            match step {
                Step::Key(k) => {
                    at.push('.');
                    at.push_str(k);
                }
                Step::Index(i) => at.push_str(&format!("[{i}]")),
            }
        }
        at
    }
}

/// The first name in `v` that serde_json `said` it does not know, in a
/// field of [`NAME_FIELDS`] whose parser refuses it: what it is, the name
/// and its field. A name elsewhere (a sentence of evidence), or one its own
/// field knows, is not it. The path is built once, from the field found
/// back up: the walk visits each value once and copies no path on the way
/// down, so a long key over many items costs in proportion to the body.
fn find_name(body: &serde_json::Value, said: &str) -> Option<(&'static str, String, String)> {
    let found = find_in(body, said)?;
    Some((found.what, found.name.to_string(), found.field("body")))
}

fn find_in<'v>(v: &'v serde_json::Value, said: &str) -> Option<Found<'v>> {
    use serde_json::Value;
    let (step, mut found) = match v {
        Value::Array(items) => items
            .iter()
            .enumerate()
            .find_map(|(i, item)| Some((Step::Index(i), find_in(item, said)?))),
        Value::Object(map) => map.iter().find_map(|(k, item)| {
            let found = match refused_in(k, item, said) {
                Some((what, name)) => Found {
                    what,
                    name,
                    steps: Vec::new(),
                },
                None => find_in(item, said)?,
            };
            Some((Step::Key(k.as_str()), found))
        }),
        _ => None,
    }?;
    found.steps.push(step);
    Some(found)
}

/// The name in `v`, the value of field `key`, that `key`'s parser refuses
/// and serde_json `said` it does not know, with what it is.
fn refused_in<'v>(
    key: &str,
    v: &'v serde_json::Value,
    said: &str,
) -> Option<(&'static str, &'v str)> {
    let (_, what, knows) = NAME_FIELDS.iter().find(|(k, ..)| *k == key)?;
    let unknown = said
        .strip_prefix("unknown ")?
        .strip_prefix(*what)?
        .strip_prefix(' ')?;
    let is_it = |n: &&str| !knows(n) && unknown.starts_with(&format!("{n:?}"));
    match v {
        serde_json::Value::String(n) if *what == "reason" => Some(n.as_str()).filter(is_it),
        serde_json::Value::Array(items) if *what == "flag" => {
            items.iter().filter_map(|i| i.as_str()).find(is_it)
        }
        _ => None,
    }
    .map(|n| (*what, n))
}

fn envelope_schema<T: JsonSchema>(kind: MessageKind) -> serde_json::Value {
    let mut schema = schemars::generate::SchemaSettings::draft2020_12()
        .into_generator()
        .into_root_schema_for::<Envelope<T>>()
        .to_value();
    let obj = schema
        .as_object_mut()
        .expect("a struct's schema is an object");
    obj.insert(
        "title".into(),
        format!("Loopwarden {} frame", kind.name()).into(),
    );
    obj.insert(
        "description".into(),
        format!(
            "JSON mirror of a {} frame, published on dc/v2/<site>/json/<host|cdu>/<id>/{}",
            kind.name(),
            kind.family().as_str()
        )
        .into(),
    );
    let props = obj
        .get_mut("properties")
        .and_then(|p| p.as_object_mut())
        .expect("a struct's schema has properties");
    props.insert("kind".into(), serde_json::json!({ "const": kind.name() }));
    props.insert(
        "protocol".into(),
        serde_json::json!({
            "type": "string",
            "pattern": format!("^{}\\.[0-9]+$", PROTOCOL.major),
            "description": "the sender's protocol version, major.minor",
        }),
    );
    schema
}

/// The JSON Schema (draft 2020-12) of the JSON form of a frame of `kind`.
pub fn schema(kind: MessageKind) -> serde_json::Value {
    match kind {
        MessageKind::HostTelemetry => envelope_schema::<HostTelemetry>(kind),
        MessageKind::HostHealth => envelope_schema::<HostHealth>(kind),
        MessageKind::Event => envelope_schema::<Event>(kind),
        MessageKind::CapLease => envelope_schema::<CapLease>(kind),
        MessageKind::QuarantineRelease => envelope_schema::<QuarantineRelease>(kind),
        MessageKind::Ack => envelope_schema::<Ack>(kind),
        MessageKind::CduTelemetry => envelope_schema::<CduTelemetry>(kind),
        MessageKind::CduState => envelope_schema::<CduState>(kind),
        MessageKind::Online => envelope_schema::<Online>(kind),
        MessageKind::ResendRequest => envelope_schema::<ResendRequest>(kind),
        MessageKind::ResendReport => envelope_schema::<ResendReport>(kind),
    }
}

/// The schema as committed: pretty-printed with a final newline.
pub fn schema_text(kind: MessageKind) -> String {
    let mut s = serde_json::to_string_pretty(&schema(kind)).expect("a schema serialises");
    s.push('\n');
    s
}
