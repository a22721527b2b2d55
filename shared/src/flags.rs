//! Small sets of named flags: one integer on the wire, a list of names in
//! JSON. Bits a reader does not know are kept (and written as `bitN` in
//! JSON), so a newer sender's flags survive a trip through an older relay.

/// Defines a set of named bits over an unsigned integer.
macro_rules! name_set {
    (
        $(#[$meta:meta])*
        $name:ident($raw:ty) {
            $( $(#[$fmeta:meta])* $flag:ident = $bit:expr => $label:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
        pub struct $name($raw);

        impl $name {
            $( $(#[$fmeta])* pub const $flag: Self = Self(1 << $bit); )+

            /// Every named bit with its JSON name, in bit order.
            pub const NAMES: &'static [(Self, &'static str)] = &[ $( (Self::$flag, $label), )+ ];

            /// The flag of a JSON name: one of [`Self::NAMES`] or `bitN`
            /// (a bit this reader has no name for); `None` for a name it
            /// does not know.
            pub fn from_name(name: &str) -> Option<Self> {
                Self::NAMES
                    .iter()
                    .find(|(_, n)| *n == name)
                    .map(|(v, _)| *v)
                    .or_else(|| {
                        name.strip_prefix("bit")
                            .and_then(|b| b.parse::<u32>().ok())
                            .filter(|b| *b < <$raw>::BITS)
                            .map(|b| Self(1 << b))
                    })
            }

            /// No flag set.
            pub const fn empty() -> Self {
                Self(0)
            }

            /// From the wire integer; unknown bits are kept.
            pub const fn from_bits(bits: $raw) -> Self {
                Self(bits)
            }

            /// The wire integer.
            pub const fn bits(self) -> $raw {
                self.0
            }

            /// Every flag of `other` is set in `self`.
            pub const fn contains(self, other: Self) -> bool {
                self.0 & other.0 == other.0
            }

            /// `self` with the flags of `other` set or cleared.
            #[must_use]
            pub const fn with(self, other: Self, on: bool) -> Self {
                if on { Self(self.0 | other.0) } else { Self(self.0 & !other.0) }
            }

            /// No flag is set.
            pub const fn is_empty(self) -> bool {
                self.0 == 0
            }
        }

        impl core::ops::BitOr for $name {
            type Output = Self;
            fn bitor(self, rhs: Self) -> Self {
                Self(self.0 | rhs.0)
            }
        }

        impl core::fmt::Debug for $name {
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                let mut l = f.debug_set();
                for bit in 0..<$raw>::BITS {
                    if self.0 & (1 << bit) != 0 {
                        match Self::NAMES.iter().find(|(v, _)| v.0 == 1 << bit) {
                            Some((_, name)) => l.entry(name),
                            None => l.entry(&bit),
                        };
                    }
                }
                l.finish()
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                use serde::ser::SerializeSeq;
                if !s.is_human_readable() {
                    return self.0.serialize(s);
                }
                let mut seq = s.serialize_seq(Some(self.0.count_ones() as usize))?;
                for bit in 0..<$raw>::BITS {
                    if self.0 & (1 << bit) == 0 {
                        continue;
                    }
                    match Self::NAMES.iter().find(|(v, _)| v.0 == 1 << bit) {
                        Some((_, name)) => seq.serialize_element(name)?,
                        None => {
                            let mut unknown = heapless::String::<8>::new();
                            let _ = core::fmt::Write::write_fmt(&mut unknown, format_args!("bit{bit}"));
                            seq.serialize_element(unknown.as_str())?
                        }
                    }
                }
                seq.end()
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct Names;
                impl<'de> serde::de::Visitor<'de> for Names {
                    type Value = $name;
                    fn expecting(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                        f.write_str(concat!("a list of ", stringify!($name), " names"))
                    }
                    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut a: A) -> Result<$name, A::Error> {
                        let mut set = $name::empty();
                        while let Some(name) = a.next_element::<heapless::String<32>>()? {
                            let name = name.as_str();
                            let flag = $name::from_name(name)
                                // Named so that `Frame::from_json` can say which and where.
                                .ok_or_else(|| serde::de::Error::custom(format_args!("unknown flag {:?}", name)))?;
                            set = set | flag;
                        }
                        Ok(set)
                    }
                }
                if d.is_human_readable() {
                    d.deserialize_seq(Names)
                } else {
                    <$raw>::deserialize(d).map(Self)
                }
            }
        }

        #[cfg(feature = "std")]
        impl schemars::JsonSchema for $name {
            fn schema_name() -> std::borrow::Cow<'static, str> {
                stringify!($name).into()
            }
            fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
                let names: std::vec::Vec<&str> = Self::NAMES.iter().map(|(_, n)| *n).collect();
                schemars::json_schema!({
                    "type": "array",
                    "uniqueItems": true,
                    "items": {
                        "anyOf": [
                            { "enum": names },
                            { "type": "string", "pattern": "^bit[0-9]{1,2}$" }
                        ]
                    }
                })
            }
        }
    };
}

pub(crate) use name_set;
