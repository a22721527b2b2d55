//! The Sparkplug B payload: the part of `sparkplug_b.proto` (Sparkplug
//! 3.0, chapter 6) this bridge writes and reads, as `prost` messages
//! written out by hand, and the metric values it publishes.
//!
//! Field numbers and types follow the specification's schema exactly; the
//! fields left out (templates, data sets, metadata, `uuid`, `body`, the
//! `is_historical` and `is_transient` flags) are never written, and a
//! reader that meets them skips them as protobuf allows.
//!
//! Glossary:
//! - *datatype*: the Sparkplug type number of a metric (`Int64` = 4,
//!   `Double` = 10, …); a birth carries it, data messages leave it out.
//! - *engUnit*: the metric property that names its engineering unit, as
//!   SCADA packages read it.

use prost::Message as _;

/// A Sparkplug B payload (`Payload` in the schema).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Payload {
    /// When the message was sent, ms since the Unix epoch (UTC).
    #[prost(uint64, optional, tag = "1")]
    pub timestamp: Option<u64>,
    /// The metrics.
    #[prost(message, repeated, tag = "2")]
    pub metrics: Vec<Metric>,
    /// The edge node's message sequence number, 0 to 255 (none in NDEATH).
    #[prost(uint64, optional, tag = "3")]
    pub seq: Option<u64>,
}

/// One metric (`Payload.Metric`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Metric {
    /// Its name; `/` separates folders.
    #[prost(string, optional, tag = "1")]
    pub name: Option<String>,
    /// An alias (this bridge uses none; a command may carry one).
    #[prost(uint64, optional, tag = "2")]
    pub alias: Option<u64>,
    /// When the value was measured, ms since the Unix epoch (UTC).
    #[prost(uint64, optional, tag = "3")]
    pub timestamp: Option<u64>,
    /// The Sparkplug datatype (births only).
    #[prost(uint32, optional, tag = "4")]
    pub datatype: Option<u32>,
    /// The value is unknown (a lost sensor, a GPU field not supported).
    #[prost(bool, optional, tag = "7")]
    pub is_null: Option<bool>,
    /// Properties (here: `engUnit` in births).
    #[prost(message, optional, tag = "9")]
    pub properties: Option<PropertySet>,
    /// The value.
    #[prost(oneof = "MetricValue", tags = "10, 11, 12, 13, 14, 15")]
    pub value: Option<MetricValue>,
}

/// The value of a metric (`Metric.value`, a `oneof`).
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum MetricValue {
    /// Int8 to Int32 and UInt8 to UInt32.
    #[prost(uint32, tag = "10")]
    Int(u32),
    /// Int64, UInt64, DateTime.
    #[prost(uint64, tag = "11")]
    Long(u64),
    /// Float.
    #[prost(float, tag = "12")]
    Float(f32),
    /// Double.
    #[prost(double, tag = "13")]
    Double(f64),
    /// Boolean.
    #[prost(bool, tag = "14")]
    Boolean(bool),
    /// String, Text.
    #[prost(string, tag = "15")]
    String(String),
}

/// Named properties of a metric (`Payload.PropertySet`): two lists of the
/// same length.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PropertySet {
    /// The names.
    #[prost(string, repeated, tag = "1")]
    pub keys: Vec<String>,
    /// The values, in the order of `keys`.
    #[prost(message, repeated, tag = "2")]
    pub values: Vec<PropertyValue>,
}

/// One property value (`Payload.PropertyValue`), strings only here.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PropertyValue {
    /// Its Sparkplug datatype.
    #[prost(uint32, optional, tag = "1")]
    pub r#type: Option<u32>,
    /// A string value.
    #[prost(string, optional, tag = "8")]
    pub string_value: Option<String>,
}

/// The Sparkplug datatypes this bridge publishes (chapter 6, "Data Types").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataType {
    /// Signed 64-bit (`bdSeq`).
    Int64 = 4,
    /// Unsigned 8-bit (whole °C, %).
    UInt8 = 5,
    /// Unsigned 32-bit (watts).
    UInt32 = 7,
    /// Unsigned 64-bit (counters).
    UInt64 = 8,
    /// 64-bit floating point (fixed-point units in their natural unit).
    Double = 10,
    /// Boolean.
    Boolean = 11,
    /// UTF-8 string.
    String = 12,
}

impl DataType {
    /// Its name in the specification.
    pub fn name(self) -> &'static str {
        match self {
            DataType::Int64 => "Int64",
            DataType::UInt8 => "UInt8",
            DataType::UInt32 => "UInt32",
            DataType::UInt64 => "UInt64",
            DataType::Double => "Double",
            DataType::Boolean => "Boolean",
            DataType::String => "String",
        }
    }
}

/// A metric's value as the bridge keeps it.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// Int64.
    Int64(i64),
    /// UInt8.
    UInt8(u8),
    /// UInt32.
    UInt32(u32),
    /// UInt64.
    UInt64(u64),
    /// Double.
    Double(f64),
    /// Boolean.
    Boolean(bool),
    /// String.
    String(String),
}

impl Value {
    fn encode(&self) -> MetricValue {
        match self {
            // Sparkplug carries a signed integer as its two's complement.
            Value::Int64(v) => MetricValue::Long(*v as u64),
            Value::UInt8(v) => MetricValue::Int(u32::from(*v)),
            Value::UInt32(v) => MetricValue::Int(*v),
            Value::UInt64(v) => MetricValue::Long(*v),
            Value::Double(v) => MetricValue::Double(*v),
            Value::Boolean(v) => MetricValue::Boolean(*v),
            Value::String(v) => MetricValue::String(v.clone()),
        }
    }
}

/// A metric as the bridge keeps it: a name, a datatype, a value or
/// none, its unit, and when the value was measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    /// The metric's name.
    pub name: String,
    /// Its datatype.
    pub datatype: DataType,
    /// Its value; `None` is published as null.
    pub value: Option<Value>,
    /// Its engineering unit, if it has one.
    pub unit: Option<&'static str>,
    /// When it was measured, ms since the Unix epoch.
    pub time: u64,
}

impl Point {
    /// The metric as a birth carries it: name, datatype, unit and value.
    pub fn to_birth(&self) -> Metric {
        Metric {
            datatype: Some(self.datatype as u32),
            properties: self.unit.map(|u| PropertySet {
                keys: vec!["engUnit".to_string()],
                values: vec![PropertyValue {
                    r#type: Some(DataType::String as u32),
                    string_value: Some(u.to_string()),
                }],
            }),
            ..self.to_data()
        }
    }

    /// The metric as a data message carries it: name and value.
    pub fn to_data(&self) -> Metric {
        Metric {
            name: Some(self.name.clone()),
            alias: None,
            timestamp: Some(self.time),
            datatype: None,
            is_null: self.value.is_none().then_some(true),
            properties: None,
            value: self.value.as_ref().map(Value::encode),
        }
    }
}

/// Encodes a payload.
pub fn encode(timestamp: u64, seq: Option<u8>, metrics: Vec<Metric>) -> Vec<u8> {
    Payload {
        timestamp: Some(timestamp),
        metrics,
        seq: seq.map(u64::from),
    }
    .encode_to_vec()
}

/// Decodes a payload (a command, or in tests anything the bridge wrote).
pub fn decode(bytes: &[u8]) -> Result<Payload, prost::DecodeError> {
    Payload::decode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bytes worked out by hand from the schema's field numbers, so a
    /// wrong tag in the structs above cannot pass by agreeing with itself.
    #[test]
    fn an_ndeath_is_encoded_as_the_schema_says() {
        let bd_seq = Point {
            name: "bdSeq".into(),
            datatype: DataType::Int64,
            value: Some(Value::Int64(3)),
            unit: None,
            time: 300,
        };
        let bytes = encode(300, None, vec![bd_seq.to_birth()]);
        let expected = [
            0x08, 0xac, 0x02, // 1: timestamp = 300 (varint)
            0x12, 0x0e, // 2: one metric, 14 bytes
            0x0a, 0x05, b'b', b'd', b'S', b'e', b'q', // 1: name
            0x18, 0xac, 0x02, // 3: timestamp = 300
            0x20, 0x04, // 4: datatype Int64
            0x58, 0x03, // 11: long_value = 3
        ];
        assert_eq!(bytes, expected);
    }

    #[test]
    fn a_birth_metric_carries_its_unit_and_a_null_says_so() {
        let p = Point {
            name: "supply_temp_c".into(),
            datatype: DataType::Double,
            value: None,
            unit: Some("°C"),
            time: 1,
        };
        let m = decode(&encode(1, Some(7), vec![p.to_birth()])).unwrap();
        assert_eq!(m.seq, Some(7));
        let metric = &m.metrics[0];
        assert_eq!(metric.is_null, Some(true));
        assert_eq!(metric.value, None);
        assert_eq!(metric.datatype, Some(10));
        let props = metric.properties.as_ref().unwrap();
        assert_eq!(props.keys, ["engUnit"]);
        assert_eq!(props.values[0].string_value.as_deref(), Some("°C"));
        let data = p.to_data();
        assert_eq!((data.datatype, data.properties), (None, None));
    }

    #[test]
    fn values_take_the_fields_the_specification_gives_their_types() {
        let cases = [
            (Value::Int64(-1), MetricValue::Long(u64::MAX)),
            (Value::UInt8(59), MetricValue::Int(59)),
            (Value::UInt32(117_550), MetricValue::Int(117_550)),
            (Value::UInt64(9), MetricValue::Long(9)),
            (Value::Double(32.05), MetricValue::Double(32.05)),
            (Value::Boolean(true), MetricValue::Boolean(true)),
            (Value::String("x".into()), MetricValue::String("x".into())),
        ];
        for (v, want) in cases {
            assert_eq!(v.encode(), want);
        }
    }
}
