extern crate std;

use std::vec::Vec;

use super::*;

include!("cases.rs");

#[test]
fn the_agreed_words_decode_to_the_agreed_values() {
    for (l, words, want) in DECODE {
        let got = l.register().decode(l.order, words);
        assert_eq!(got.to_bits(), want.to_bits(), "{l:?} {words:04X?}: {got}");
    }
}

#[test]
fn the_agreed_values_encode_to_the_agreed_words() {
    for (l, value, want) in ENCODE {
        let got = match l.register().encode(l.order, *value) {
            Ok(w) => Want::Words(std::vec::Vec::leak(w.to_vec())),
            Err(EncodeError::OutOfRange { min, max }) => {
                assert_eq!(Some((min, max)), l.range, "{l:?} {value}");
                Want::OutOfRange
            }
            Err(EncodeError::DoesNotFit) => Want::DoesNotFit,
        };
        assert_eq!(got, *want, "{l:?} {value}");
    }
}

/// The encoding `loopwarden_boards` had before this crate, with `std`'s
/// `f64::round`: the shared one must give the same words and the same
/// refusals for every value.
fn encoded_with_std_round(r: &Register<&str>, order: WordOrder, value: f64) -> Option<Vec<u16>> {
    if let (Some(min), Some(max)) = (r.min, r.max) {
        if !(min..=max).contains(&value) {
            return None;
        }
    }
    let raw = (value / r.scale).round();
    let (lo, hi) = r.ty.raw_range();
    if !raw.is_finite() || raw < lo || raw > hi {
        return None;
    }
    let bits: u32 = match r.ty {
        Type::U16 => raw as u16 as u32,
        Type::I16 => raw as i16 as u16 as u32,
        Type::U32 => raw as u32,
        Type::I32 => raw as i32 as u32,
    };
    Some(match (r.ty.words(), order) {
        (1, _) => std::vec![bits as u16],
        (_, WordOrder::HighFirst) => std::vec![(bits >> 16) as u16, bits as u16],
        (_, WordOrder::LowFirst) => std::vec![bits as u16, (bits >> 16) as u16],
    })
}

/// A fixed stream of numbers (xorshift), so a failure repeats.
struct Numbers(u64);

impl Numbers {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn values() -> Vec<f64> {
    let mut v = std::vec![
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        0.0,
        -0.0,
        f64::MAX,
        f64::MIN,
        0.49999999999999994,
        -0.49999999999999994,
        4_503_599_627_370_495.5,
        -4_503_599_627_370_495.5,
    ];
    for bound in [
        65_535.0,
        -32_768.0,
        32_767.0,
        4_294_967_295.0,
        -2_147_483_648.0,
    ] {
        for d in [-1.0, -0.5, -0.499_999, 0.0, 0.499_999, 0.5, 1.0] {
            v.push(bound + d);
        }
    }
    for k in -20_000i32..20_000 {
        v.extend([
            f64::from(k) * 0.5,
            f64::from(k) * 0.005,
            f64::from(k) * 0.05,
        ]);
    }
    let mut n = Numbers(0x9E37_79B9_7F4A_7C15);
    for _ in 0..20_000 {
        let x = n.next();
        v.extend([f64::from_bits(x), (x >> 11) as f64 / 9.0e10 - 50_000.0]);
    }
    v
}

#[test]
fn encoding_gives_what_std_rounding_gives_for_every_type_order_scale_and_range() {
    let values = values();
    for ty in [Type::U16, Type::I16, Type::U32, Type::I32] {
        for order in [WordOrder::HighFirst, WordOrder::LowFirst] {
            for scale in [0.01, 0.1, 1.0, 0.001, 10.0, 0.05] {
                for range in [None, Some((17.0, 45.0)), Some((-50.0, 1e9))] {
                    let l = Layout {
                        ty,
                        order,
                        scale,
                        range,
                    };
                    let r = l.register();
                    for &value in &values {
                        let got = r.encode(order, value).ok().map(|w| w.to_vec());
                        let want = encoded_with_std_round(&r, order, value);
                        assert_eq!(got, want, "{l:?} {value:e}");
                    }
                }
            }
        }
    }
}

#[test]
fn rounding_is_std_rounding_but_for_the_sign_of_zero() {
    for x in values() {
        let (got, want) = (round(x), x.round());
        assert!(
            got == want || (got.is_nan() && want.is_nan()),
            "{x:e}: {got} against {want}"
        );
    }
    assert_eq!(round(-0.4).to_bits(), 0.0f64.to_bits());
}

#[test]
fn words_split_and_join_by_the_word_order() {
    for order in [WordOrder::HighFirst, WordOrder::LowFirst] {
        for ty in [Type::U16, Type::I16, Type::U32, Type::I32] {
            let bits = if ty.words() == 1 { 0xBEEF } else { 0xDEAD_BEEF };
            let words = order.split(ty, bits);
            assert_eq!(words.len(), usize::from(ty.words()));
            assert_eq!(order.join(ty, &words), bits, "{order:?} {ty:?}");
        }
    }
    assert_eq!(
        WordOrder::HighFirst
            .split(Type::U32, 0x0001_CB2E)
            .as_slice(),
        &[0x0001, 0xCB2E]
    );
}

#[cfg(feature = "std")]
mod file {
    use std::string::{String, ToString};
    use std::vec::Vec;

    use crate::{Kind, MapError, MapFile, Register, Type, WordOrder, BIT_REGISTERS};

    fn reg(name: &str, kind: Kind, address: u16, ty: Type) -> Register<String> {
        let range = (kind == Kind::Holding).then_some(0.0);
        Register {
            name: name.into(),
            kind,
            address,
            ty,
            scale: 1.0,
            unit: String::new(),
            min: range,
            max: range,
            description: String::new(),
        }
    }

    fn check(register: Vec<Register<String>>) -> Result<(), String> {
        let file = MapFile {
            model: "m".into(),
            word_order: WordOrder::HighFirst,
            unit_id: 1,
            register,
        };
        file.check().map_err(|e: MapError| e.to_string())
    }

    #[test]
    fn a_map_is_refused_at_its_first_bad_register_with_the_reason() {
        let a = reg("a", Kind::Input, 10, Type::U32);
        assert_eq!(check(std::vec![a.clone()]), Ok(()));
        // The same addresses in the other kind are another register.
        assert_eq!(
            check(std::vec![a.clone(), reg("h", Kind::Holding, 10, Type::U32)]),
            Ok(())
        );
        let e = check(std::vec![a.clone(), reg("b", Kind::Input, 11, Type::U16)]);
        assert_eq!(e.unwrap_err(), "b and a both use Input register 11");
        let e = check(std::vec![a.clone(), reg("a", Kind::Input, 12, Type::U16)]);
        assert_eq!(e.unwrap_err(), "register \"a\" appears twice");
        let e = check(std::vec![reg("end", Kind::Input, 65_535, Type::I32)]);
        assert_eq!(e.unwrap_err(), "end: runs past address 65535");
        let mut s = a.clone();
        s.scale = f64::NAN;
        assert_eq!(check(std::vec![s]).unwrap_err(), "a: scale must be above 0");
        let mut i = a.clone();
        i.max = Some(1.0);
        assert!(check(std::vec![i])
            .unwrap_err()
            .starts_with("a: min and max are for holding registers"));
        let mut h = reg("h", Kind::Holding, 0, Type::U16);
        h.min = Some(2.0);
        assert!(check(std::vec![h])
            .unwrap_err()
            .starts_with("h: a holding register needs min <= max"));
    }

    /// `r` at `scale`.
    fn scaled(r: Register<String>, scale: f64) -> Register<String> {
        Register { scale, ..r }
    }

    /// Every bit word as the shipped map (`boards/cdus/sim-cdu.toml`)
    /// has it: the inputs at 4-6 and 17-19, the settings at holding 2-5.
    fn shipped_bits() -> Vec<Register<String>> {
        let at = |name: &str| match name {
            "pump_a_running" => (Kind::Input, 4),
            "pump_b_running" => (Kind::Input, 5),
            "leak_inputs" => (Kind::Input, 6),
            "valves_closed" => (Kind::Input, 17),
            "pump_a_fault" => (Kind::Input, 18),
            "pump_b_fault" => (Kind::Input, 19),
            "lead_pump" => (Kind::Holding, 2),
            "valves_open" => (Kind::Holding, 3),
            "pumps_run" => (Kind::Holding, 4),
            _ => (Kind::Holding, 5),
        };
        BIT_REGISTERS
            .iter()
            .map(|(name, _)| {
                let (kind, address) = at(name);
                reg(name, kind, address, Type::U16)
            })
            .collect()
    }

    #[test]
    fn bit_words_as_shipped_pass_and_other_registers_may_be_signed_and_scaled() {
        let mut regs = shipped_bits();
        regs.push(scaled(reg("supply_temp", Kind::Input, 0, Type::I16), 0.01));
        regs.push(scaled(reg("flow", Kind::Input, 2, Type::U16), 0.1));
        assert_eq!(check(regs), Ok(()));
    }

    #[test]
    fn a_signed_or_scaled_bit_word_is_refused_naming_it() {
        // An i16 with rack 15 wet (bit 15) decodes negative, and at scale
        // 0.1 rack 2 wet (raw 4) decodes 0.4: both would read dry.
        for (name, _) in BIT_REGISTERS {
            for (ty, scale, found) in [
                (Type::I16, 1.0, "i16 at scale 1"),
                (Type::U16, 0.1, "u16 at scale 0.1"),
                (Type::U32, 1.0, "u32 at scale 1"),
            ] {
                let regs: Vec<_> = shipped_bits()
                    .into_iter()
                    .map(|mut r| {
                        if r.name == name {
                            (r.ty, r.scale) = (ty, scale);
                        }
                        r
                    })
                    .collect();
                let e = check(regs).unwrap_err();
                assert!(
                    e.starts_with(&std::format!("{name}: ")),
                    "{name} {found}: {e}"
                );
                assert!(
                    e.ends_with(&std::format!(
                        "read as bits: a bit word needs type u16 at scale 1, not {found}"
                    )),
                    "{e}"
                );
            }
        }
        let e = check(std::vec![reg("leak_inputs", Kind::Input, 6, Type::I16)]);
        assert_eq!(
            e.unwrap_err(),
            "leak_inputs: the leak inputs, bit n = rack n, read as bits: a bit word needs \
             type u16 at scale 1, not i16 at scale 1"
        );
    }

    /// Holding register `name` of type `ty` at `scale` with the range
    /// `min` to `max`, alone in a map: the check's answer.
    fn setting(name: &str, ty: Type, scale: f64, min: f64, max: f64) -> Result<(), String> {
        let r = Register {
            min: Some(min),
            max: Some(max),
            ..scaled(reg(name, Kind::Holding, 5, ty), scale)
        };
        check(std::vec![r])
    }

    #[test]
    fn a_setting_range_past_what_its_type_holds_is_refused_naming_both_ranges() {
        // A heartbeat counting to 99,999 in a u16: from 65,536 on no step
        // could be written, and the CDU would fall back for hours.
        assert_eq!(
            setting("heartbeat", Type::U16, 1.0, 0.0, 99_999.0).unwrap_err(),
            "heartbeat: its range 0 to 99999 is raw 0 to 99999 at scale 1, past what a u16 \
             holds (raw 0 to 65535): a write near its end could not be sent"
        );
        assert_eq!(
            setting("heartbeat", Type::U16, 1.0, -32_768.0, 32_767.0).unwrap_err(),
            "heartbeat: its range -32768 to 32767 is raw -32768 to 32767 at scale 1, past \
             what a u16 holds (raw 0 to 65535): a write near its end could not be sent"
        );
        assert_eq!(setting("heartbeat", Type::U16, 1.0, 0.0, 65_535.0), Ok(()));
        assert_eq!(
            setting("supply_setpoint", Type::I16, 1.0, -32_768.0, 32_767.0),
            Ok(())
        );
        // Every setting, at its scale: raw is the value over the scale,
        // rounded as a write rounds it.
        let speed = |max| setting("pump_speed", Type::U16, 0.1, 30.0, max);
        assert_eq!(speed(6_553.5), Ok(()));
        assert_eq!(
            speed(6_553.6).unwrap_err(),
            "pump_speed: its range 30 to 6553.6 is raw 300 to 65536 at scale 0.1, past what a \
             u16 holds (raw 0 to 65535): a write near its end could not be sent"
        );
        let setpoint = |min| setting("supply_setpoint", Type::I16, 0.01, min, 45.0);
        assert_eq!(setpoint(-327.68), Ok(()));
        assert!(setpoint(-327.69)
            .unwrap_err()
            .starts_with("supply_setpoint: its range -327.69 to 45 is raw -32769 to 4500"));
        let wide = |min, max| setting("pump_speed", Type::I32, 1.0, min, max);
        assert_eq!(wide(-2_147_483_648.0, 2_147_483_647.0), Ok(()));
        assert!(wide(0.0, 2_147_483_648.0)
            .unwrap_err()
            .ends_with("past what an i32 holds (raw -2147483648 to 2147483647): a write near its end could not be sent"));
        assert!(setting("pump_speed", Type::U32, 1.0, -1.0, 100.0)
            .unwrap_err()
            .contains("past what a u32 holds (raw 0 to 4294967295)"));
        assert!(
            setting("pump_speed", Type::U32, 1.0, f64::NEG_INFINITY, 100.0)
                .unwrap_err()
                .starts_with("pump_speed: its range -inf to 100 is raw -inf to 100")
        );
    }
}

#[test]
fn a_measurements_sentinel_reads_none_and_a_bit_word_keeps_every_pattern() {
    let cases: [(Type, WordOrder, &[u16]); 6] = [
        (Type::U16, HF, &[0xFFFF]),
        (Type::I16, HF, &[0x8000]),
        (Type::U32, HF, &[0xFFFF, 0xFFFF]),
        (Type::U32, LF, &[0xFFFF, 0xFFFF]),
        (Type::I32, HF, &[0x8000, 0x0000]),
        (Type::I32, LF, &[0x0000, 0x8000]),
    ];
    for (ty, order, words) in cases {
        let r = input(ty, order, 0.1).register();
        assert_eq!(
            r.reading(order, words),
            None,
            "{ty:?} {order:?} {words:04X?}"
        );
        // One bit off the sentinel is a figure, the nearest there is.
        let mut near = words.to_vec();
        let last = near.len() - 1;
        near[last] ^= 1;
        assert_eq!(
            r.reading(order, &near),
            Some(r.decode(order, &near)),
            "{ty:?} {order:?} {near:04X?}"
        );
    }
    for (name, _) in BIT_REGISTERS {
        let r = Register {
            name,
            ..input(Type::U16, HF, 1.0).register()
        };
        assert_eq!(r.reading(HF, &[0xFFFF]), Some(65_535.0), "{name}");
    }
}

/// The heartbeat as `std`'s `f64` has it (`ceil`, `floor`, `rem_euclid`):
/// the shared one, in whole numbers, must give the same.
fn heartbeat_with_std(r: &Register<&str>, counter: f64) -> f64 {
    let Some((min, max)) = r.min.zip(r.max) else {
        return counter.rem_euclid(65_536.0);
    };
    let values = max.floor() - min.ceil() + 1.0;
    if values.is_nan() || values < 1.0 {
        return counter.rem_euclid(65_536.0);
    }
    min.ceil() + counter.rem_euclid(values)
}

#[test]
fn the_heartbeat_cycles_through_the_whole_numbers_of_its_range() {
    let hb = |min: f64, max: f64| Layout {
        range: Some((min, max)),
        ..setting(Type::I16, HF, 1.0, 0.0, 0.0)
    };
    let steps = |r: &Register<&str>, from: u32, to: u32| -> Vec<f64> {
        (from..=to).map(|c| r.heartbeat(f64::from(c))).collect()
    };
    // 0 to 255: step 256 writes 0 again, and never a value out of range.
    let byte = hb(0.0, 255.0).register();
    assert_eq!(steps(&byte, 254, 258), [254.0, 255.0, 0.0, 1.0, 2.0]);
    assert_eq!(byte.heartbeat(65_535.0), 255.0);
    // A negative minimum: -3 to 1, five values.
    let below = hb(-3.0, 1.0).register();
    assert_eq!(
        steps(&below, 0, 6),
        [-3.0, -2.0, -1.0, 0.0, 1.0, -3.0, -2.0]
    );
    let negative = hb(-7.5, -5.2).register();
    assert_eq!(steps(&negative, 0, 3), [-7.0, -6.0, -7.0, -6.0]);
    // A fractional range: its whole numbers 1 to 3.
    let fraction = hb(0.5, 3.7).register();
    assert_eq!(steps(&fraction, 0, 4), [1.0, 2.0, 3.0, 1.0, 2.0]);
    // No range: the counter as a word holds it.
    let free = input(Type::U16, HF, 1.0).register();
    assert_eq!(steps(&free, 65_534, 65_536), [65_534.0, 65_535.0, 0.0]);
    // No whole number in the range: the counter, for the map's check to
    // refuse before any write.
    assert_eq!(hb(7.2, 7.5).register().heartbeat(3.0), 3.0);
    for r in [byte, below, negative, fraction, hb(10.0, 265.0).register()] {
        for c in (0..=70_000).step_by(7) {
            let c = f64::from(c);
            let v = r.heartbeat(c);
            assert_eq!(v, heartbeat_with_std(&r, c), "{:?} {c}", r.min.zip(r.max));
            assert!(r.encode(HF, v).is_ok(), "{:?} {c}: {v}", r.min.zip(r.max));
        }
    }
}
