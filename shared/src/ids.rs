//! Who is who on the bus: sites, hosts, CDUs, GPUs and racks, and the
//! bounded text fields of messages.
//!
//! Glossary:
//! - *ident*: a name that is also a topic level: 1 to 32 characters of
//!   `A–Z a–z 0–9 _ - .`, so it can never contain an MQTT wildcard (`+`, `#`),
//!   a level separator (`/`) or start a system topic (`$`).
//! - *node*: anything that sends frames: a host's node agent, a CDU's
//!   controller, an operator's console, a facility system.
//! - *GPU index*: the GPU's NVML index on its host, 0 to 15.

use core::fmt;
use core::ops::Deref;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The longest ident, in bytes.
pub const IDENT_MAX: usize = 32;
/// The most GPUs one host frame carries.
pub const MAX_GPUS: usize = 16;
/// The most racks one CDU serves.
pub const MAX_RACKS: usize = 16;

/// Why a name was refused as an ident.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum IdentError {
    /// The name is empty.
    Empty,
    /// The name is longer than [`IDENT_MAX`] bytes.
    TooLong,
    /// The name holds a character other than `A–Z a–z 0–9 _ - .`.
    BadChar(char),
}

impl fmt::Display for IdentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IdentError::Empty => write!(f, "name is empty"),
            IdentError::TooLong => write!(f, "name is longer than {IDENT_MAX} bytes"),
            IdentError::BadChar(c) => write!(
                f,
                "name holds {c:?}; only letters, digits, '_', '-' and '.' are allowed"
            ),
        }
    }
}

impl core::error::Error for IdentError {}

/// A validated name usable as a topic level (see the module note).
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ident(heapless::String<IDENT_MAX>);

impl Ident {
    /// Checks and copies `name`.
    pub fn new(name: &str) -> Result<Self, IdentError> {
        if name.is_empty() {
            return Err(IdentError::Empty);
        }
        if name.len() > IDENT_MAX {
            return Err(IdentError::TooLong);
        }
        if let Some(c) = name
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')))
        {
            return Err(IdentError::BadChar(c));
        }
        let mut s = heapless::String::new();
        // Length checked above; push_str cannot fail.
        let _ = s.push_str(name);
        Ok(Self(s))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Deref for Ident {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Ident {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for Ident {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self)
    }
}

impl Serialize for Ident {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self)
    }
}

impl<'de> Deserialize<'de> for Ident {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <heapless::String<IDENT_MAX>>::deserialize(d)?;
        Ident::new(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(feature = "std")]
impl schemars::JsonSchema for Ident {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Ident".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "pattern": "^[A-Za-z0-9_.-]{1,32}$",
            "description": "a name that is also a topic level",
        })
    }
}

/// What kind of node sent a frame, and which topic subtree it owns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "std", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// A GPU host's node agent (`host/<id>/…`).
    Host,
    /// A CDU's cooling controller (`cdu/<id>/…`).
    Cdu,
    /// An operator's console or CLI (sends commands only).
    Operator,
    /// A facility system: power budget, BMS, DCIM (sends commands only).
    Facility,
}

impl Role {
    /// The topic level of this role, where it owns a subtree.
    pub const fn as_str(self) -> &'static str {
        match self {
            Role::Host => "host",
            Role::Cdu => "cdu",
            Role::Operator => "operator",
            Role::Facility => "facility",
        }
    }
}

/// The sender of a frame: a role and a name unique within the site.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "std", derive(schemars::JsonSchema))]
pub struct NodeId {
    /// What kind of node.
    pub role: Role,
    /// Its name (the host name, the CDU's tag, the operator's login).
    pub id: Ident,
}

impl NodeId {
    /// A node with a checked name.
    pub fn new(role: Role, id: &str) -> Result<Self, IdentError> {
        Ok(Self {
            role,
            id: Ident::new(id)?,
        })
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.role.as_str(), self.id)
    }
}

/// A GPU's NVML index on its host, 0 to 15.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
#[cfg_attr(feature = "std", derive(schemars::JsonSchema))]
pub struct GpuIndex(#[cfg_attr(feature = "std", schemars(range(max = 15)))] u8);

impl GpuIndex {
    /// An index below [`MAX_GPUS`], else `None`.
    pub const fn new(i: u8) -> Option<Self> {
        if (i as usize) < MAX_GPUS {
            Some(Self(i))
        } else {
            None
        }
    }

    /// The index.
    pub const fn get(self) -> u8 {
        self.0
    }
}

impl<'de> Deserialize<'de> for GpuIndex {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let i = u8::deserialize(d)?;
        GpuIndex::new(i).ok_or_else(|| serde::de::Error::custom("GPU index above 15"))
    }
}

impl fmt::Display for GpuIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GPU {}", self.0)
    }
}

/// A rack served by a CDU, numbered from 0 to 15.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
#[cfg_attr(feature = "std", derive(schemars::JsonSchema))]
pub struct RackIndex(#[cfg_attr(feature = "std", schemars(range(max = 15)))] u8);

impl RackIndex {
    /// A rack below [`MAX_RACKS`], else `None`.
    pub const fn new(i: u8) -> Option<Self> {
        if (i as usize) < MAX_RACKS {
            Some(Self(i))
        } else {
            None
        }
    }

    /// The index.
    pub const fn get(self) -> u8 {
        self.0
    }
}

impl<'de> Deserialize<'de> for RackIndex {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let i = u8::deserialize(d)?;
        RackIndex::new(i).ok_or_else(|| serde::de::Error::custom("rack index above 15"))
    }
}

/// Free text of at most `N` bytes (evidence, an operator's reason).
/// [`Text::truncated`] cuts longer text at a character boundary and marks
/// the cut with `…`, so building a message never fails on a long sentence.
#[derive(Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Text<const N: usize>(heapless::String<N>);

impl<const N: usize> Text<N> {
    /// `s` if it fits, else `None`.
    pub fn new(s: &str) -> Option<Self> {
        let mut t = heapless::String::new();
        t.push_str(s).ok()?;
        Some(Self(t))
    }

    /// `s`, cut at a character boundary with a trailing `…` if it does not fit.
    pub fn truncated(s: &str) -> Self {
        if let Some(t) = Self::new(s) {
            return t;
        }
        const ELLIPSIS: &str = "…";
        let mut end = N.saturating_sub(ELLIPSIS.len());
        while end > 0 && !s.is_char_boundary(end) {
            end -= 1;
        }
        let mut t = heapless::String::new();
        let _ = t.push_str(&s[..end]);
        let _ = t.push_str(ELLIPSIS);
        Self(t)
    }

    /// The text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl<const N: usize> Deref for Text<N> {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl<const N: usize> fmt::Debug for Text<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl<const N: usize> fmt::Display for Text<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self)
    }
}

#[cfg(feature = "std")]
impl<const N: usize> schemars::JsonSchema for Text<N> {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        std::format!("Text{N}").into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "maxLength": N,
            "description": std::format!("free text of at most {N} bytes of UTF-8"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ident_refuses_topic_breakers() {
        assert!(Ident::new("h07").is_ok());
        assert!(Ident::new("rack-2.cdu_a").is_ok());
        assert_eq!(Ident::new(""), Err(IdentError::Empty));
        assert_eq!(Ident::new("a/b"), Err(IdentError::BadChar('/')));
        assert_eq!(Ident::new("+"), Err(IdentError::BadChar('+')));
        assert_eq!(Ident::new("#"), Err(IdentError::BadChar('#')));
        assert_eq!(Ident::new("$SYS"), Err(IdentError::BadChar('$')));
        assert_eq!(Ident::new(&"x".repeat(33)), Err(IdentError::TooLong));
    }

    #[test]
    fn ident_decoding_checks_the_name() {
        let mut buf = [0u8; 8];
        let bytes = postcard::to_slice("a/b", &mut buf).unwrap();
        assert!(postcard::from_bytes::<Ident>(bytes).is_err());
    }

    #[test]
    fn gpu_index_is_bounded() {
        assert!(GpuIndex::new(15).is_some());
        assert!(GpuIndex::new(16).is_none());
        assert!(postcard::from_bytes::<GpuIndex>(&[16]).is_err());
    }

    #[test]
    fn text_truncates_at_char_boundary() {
        let t = Text::<8>::truncated("ααααα"); // 10 bytes
        assert!(t.len() <= 8);
        assert!(t.ends_with('…'));
        assert_eq!(Text::<8>::truncated("short").as_str(), "short");
    }
}
