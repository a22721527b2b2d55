// The register words and values every reader of a CDU's map must agree on:
// each type, both word orders, the sign bits, a lost sensor's sentinel,
// rounding half away from zero, values outside a type or a setting's range
// and values that are not numbers. Not a module: `include!`d by the tests
// of this crate (through `Register` itself), of loopwarden-boards (through
// `RegisterMap`, the map read from a file) and of the firmware (through its
// built-in table's calls), each of which has `Type`, `WordOrder`, `Kind`
// and `Register` in scope, so the Linux side and the firmware are held to
// the same answers.

/// A register for a case: type, word order, scale and, for a setting
/// (a holding register), the range a write may set (`None`: an input).
#[derive(Debug, Clone, Copy)]
pub struct Layout {
    pub ty: Type,
    pub order: WordOrder,
    pub scale: f64,
    pub range: Option<(f64, f64)>,
}

impl Layout {
    /// The case as a register of its own (named "case", at address 0),
    /// for the tests that call a `Register` rather than read a map file.
    #[allow(dead_code)] // loopwarden-boards' tests read a map file instead
    pub fn register(&self) -> Register<&'static str> {
        Register {
            name: "case",
            kind: if self.range.is_some() {
                Kind::Holding
            } else {
                Kind::Input
            },
            address: 0,
            ty: self.ty,
            scale: self.scale,
            unit: "",
            min: self.range.map(|r| r.0),
            max: self.range.map(|r| r.1),
            description: "",
        }
    }
}

const fn input(ty: Type, order: WordOrder, scale: f64) -> Layout {
    Layout {
        ty,
        order,
        scale,
        range: None,
    }
}

const fn setting(ty: Type, order: WordOrder, scale: f64, min: f64, max: f64) -> Layout {
    Layout {
        ty,
        order,
        scale,
        range: Some((min, max)),
    }
}

const HF: WordOrder = WordOrder::HighFirst;
const LF: WordOrder = WordOrder::LowFirst;

/// Words, by address, and the value they carry.
pub const DECODE: &[(Layout, &[u16], f64)] = &[
    (input(Type::U16, HF, 1.0), &[0], 0.0),
    // u16's "no value" reads as the number it is, on both sides.
    (input(Type::U16, HF, 1.0), &[0xFFFF], 65_535.0),
    (input(Type::U16, LF, 0.5), &[3], 1.5),
    (input(Type::U16, HF, 0.1), &[1728], 172.8),
    (input(Type::I16, HF, 1.0), &[0x7FFF], 32_767.0),
    (input(Type::I16, HF, 1.0), &[0x8000], -32_768.0),
    (input(Type::I16, LF, 1.0), &[0xFFFF], -1.0),
    // A lost outdoor sensor's 0x8000: -327.68 °C, judged by the decision
    // path, not here.
    (input(Type::I16, HF, 0.01), &[0x8000], -327.68),
    (input(Type::I16, HF, 0.01), &[(-1234i16) as u16], -12.34),
    (input(Type::U32, HF, 1.0), &[0x0001, 0xCB2E], 117_550.0),
    (input(Type::U32, LF, 1.0), &[0xCB2E, 0x0001], 117_550.0),
    (
        input(Type::U32, HF, 1.0),
        &[0xFFFF, 0xFFFF],
        4_294_967_295.0,
    ),
    (input(Type::U32, LF, 10.0), &[0x86A0, 0x0001], 1_000_000.0),
    (input(Type::I32, HF, 1.0), &[0xFFFF, 0xFFFF], -1.0),
    (input(Type::I32, LF, 1.0), &[0xFFFE, 0xFFFF], -2.0),
    (
        input(Type::I32, HF, 1.0),
        &[0x8000, 0x0000],
        -2_147_483_648.0,
    ),
    (
        input(Type::I32, LF, 1.0),
        &[0x0000, 0x8000],
        -2_147_483_648.0,
    ),
    (
        input(Type::I32, HF, 1.0),
        &[0x7FFF, 0xFFFF],
        2_147_483_647.0,
    ),
    (input(Type::I32, HF, 0.001), &[0xFFFF, 0xFC18], -1.0),
    // Too few words: the missing ones read 0.
    (input(Type::U32, HF, 1.0), &[0x0001], 65_536.0),
    (input(Type::U32, LF, 1.0), &[0x0001], 1.0),
    (input(Type::U16, HF, 1.0), &[], 0.0),
];

/// What encoding a value gives.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Want {
    /// These words, by address.
    Words(&'static [u16]),
    /// Refused: outside the setting's range (the layout's).
    OutOfRange,
    /// Refused: does not fit the type at the scale, or is not a number.
    DoesNotFit,
}

/// A value and what encoding it for the layout gives.
pub const ENCODE: &[(Layout, f64, Want)] = &[
    (input(Type::U16, HF, 0.1), 172.8, Want::Words(&[1728])),
    (input(Type::U16, HF, 1.0), 65_535.0, Want::Words(&[0xFFFF])),
    (input(Type::U16, HF, 1.0), 65_535.4, Want::Words(&[0xFFFF])),
    (input(Type::U16, HF, 1.0), 65_535.5, Want::DoesNotFit),
    (input(Type::U16, HF, 1.0), -0.4, Want::Words(&[0])),
    (input(Type::U16, HF, 1.0), -0.5, Want::DoesNotFit),
    (input(Type::U16, LF, 1.0), -1.0, Want::DoesNotFit),
    // Half away from zero.
    (input(Type::I16, HF, 1.0), 2.5, Want::Words(&[3])),
    (
        input(Type::I16, HF, 1.0),
        -2.5,
        Want::Words(&[(-3i16) as u16]),
    ),
    (input(Type::I16, HF, 0.5), 0.25, Want::Words(&[1])),
    (input(Type::I16, HF, 0.5), -0.25, Want::Words(&[0xFFFF])),
    (input(Type::I16, HF, 1.0), 32_767.4, Want::Words(&[0x7FFF])),
    (input(Type::I16, HF, 1.0), 32_767.5, Want::DoesNotFit),
    (input(Type::I16, HF, 1.0), -32_768.4, Want::Words(&[0x8000])),
    (input(Type::I16, HF, 1.0), -32_768.5, Want::DoesNotFit),
    (input(Type::I16, HF, 0.01), -327.68, Want::Words(&[0x8000])),
    (
        input(Type::I16, HF, 0.01),
        -12.34,
        Want::Words(&[(-1234i16) as u16]),
    ),
    (input(Type::I16, HF, 0.01), f64::NAN, Want::DoesNotFit),
    (input(Type::I16, HF, 0.01), f64::INFINITY, Want::DoesNotFit),
    (
        input(Type::I16, HF, 0.01),
        f64::NEG_INFINITY,
        Want::DoesNotFit,
    ),
    (
        input(Type::U32, HF, 1.0),
        117_550.0,
        Want::Words(&[0x0001, 0xCB2E]),
    ),
    (
        input(Type::U32, LF, 1.0),
        117_550.0,
        Want::Words(&[0xCB2E, 0x0001]),
    ),
    (
        input(Type::U32, HF, 1.0),
        4_294_967_295.0,
        Want::Words(&[0xFFFF, 0xFFFF]),
    ),
    (input(Type::U32, HF, 1.0), 4_294_967_296.0, Want::DoesNotFit),
    (input(Type::U32, LF, 1.0), -0.4, Want::Words(&[0, 0])),
    (
        input(Type::I32, HF, 1.0),
        -1.0,
        Want::Words(&[0xFFFF, 0xFFFF]),
    ),
    (
        input(Type::I32, LF, 1.0),
        -2.0,
        Want::Words(&[0xFFFE, 0xFFFF]),
    ),
    (
        input(Type::I32, HF, 1.0),
        -2_147_483_648.0,
        Want::Words(&[0x8000, 0]),
    ),
    (
        input(Type::I32, LF, 1.0),
        -2_147_483_648.0,
        Want::Words(&[0, 0x8000]),
    ),
    (
        input(Type::I32, HF, 1.0),
        -2_147_483_649.0,
        Want::DoesNotFit,
    ),
    (input(Type::I32, HF, 1.0), 2_147_483_647.5, Want::DoesNotFit),
    (
        input(Type::I32, HF, 0.001),
        -1.0,
        Want::Words(&[0xFFFF, 0xFC18]),
    ),
    (input(Type::I32, HF, 1.0), 1e300, Want::DoesNotFit),
    (input(Type::I32, LF, 1.0), f64::NAN, Want::DoesNotFit),
    // Settings: the range first, then the type.
    (
        setting(Type::I16, HF, 0.01, 17.0, 45.0),
        30.004,
        Want::Words(&[3000]),
    ),
    (
        setting(Type::I16, HF, 0.01, 17.0, 45.0),
        17.0,
        Want::Words(&[1700]),
    ),
    (
        setting(Type::I16, HF, 0.01, 17.0, 45.0),
        45.0,
        Want::Words(&[4500]),
    ),
    (
        setting(Type::I16, HF, 0.01, 17.0, 45.0),
        16.99,
        Want::OutOfRange,
    ),
    (
        setting(Type::I16, HF, 0.01, 17.0, 45.0),
        45.01,
        Want::OutOfRange,
    ),
    (
        setting(Type::I16, HF, 0.01, 17.0, 45.0),
        f64::NAN,
        Want::OutOfRange,
    ),
    (
        setting(Type::I16, HF, 1.0, -50.0, 50.0),
        f64::INFINITY,
        Want::OutOfRange,
    ),
    (
        setting(Type::I16, HF, 1.0, -50.0, 50.0),
        -50.0,
        Want::Words(&[(-50i16) as u16]),
    ),
    (
        setting(Type::U16, HF, 0.1, 30.0, 100.0),
        80.0,
        Want::Words(&[800]),
    ),
    (
        setting(Type::U16, HF, 0.1, 30.0, 100.0),
        20.0,
        Want::OutOfRange,
    ),
    // A range within what the type holds (a map whose range reaches past
    // it is refused): its ends encode, and past them is out of range.
    (
        setting(Type::U16, HF, 1.0, 0.0, 65_535.0),
        65_535.0,
        Want::Words(&[0xFFFF]),
    ),
    (
        setting(Type::U16, HF, 1.0, 0.0, 65_535.0),
        70_000.0,
        Want::OutOfRange,
    ),
    (
        setting(Type::U32, LF, 1.0, 0.0, 1e9),
        100_000.0,
        Want::Words(&[0x86A0, 0x0001]),
    ),
    (
        setting(Type::U32, HF, 1.0, 0.0, 1e9),
        100_000.0,
        Want::Words(&[0x0001, 0x86A0]),
    ),
    (
        setting(Type::I32, LF, 1.0, -1e6, 1e6),
        -100_000.0,
        Want::Words(&[0x7960, 0xFFFE]),
    ),
];
