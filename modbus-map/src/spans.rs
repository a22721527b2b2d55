//! Which input registers one read takes: the map's input registers in
//! runs of contiguous addresses, each at most [`MAX_READ`] registers (the
//! Modbus limit of one read), so a client reads the whole map in as few
//! requests as the addresses allow. The Linux controller reads its spans
//! at run time; the firmware's build script turns them into its table.
//!
//! Glossary:
//! - *span*: a run of contiguous input registers read in one request.

use std::vec::Vec;

use crate::{Kind, Register};

/// The most registers one read asks for (Modbus function 4: 125).
pub const MAX_READ: u16 = 125;

/// A run of contiguous input registers that one read takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Span {
    /// First address.
    pub start: u16,
    /// Registers read.
    pub count: u16,
    /// Its registers, as indices into the registers given, by address.
    pub registers: Vec<usize>,
}

/// The input registers among `registers` in spans, by address.
pub fn input_spans<'a, S: 'a>(registers: impl IntoIterator<Item = &'a Register<S>>) -> Vec<Span> {
    let mut inputs: Vec<(usize, &Register<S>)> = registers
        .into_iter()
        .enumerate()
        .filter(|(_, r)| r.kind == Kind::Input)
        .collect();
    inputs.sort_by_key(|(_, r)| r.address);
    let mut spans: Vec<Span> = Vec::new();
    for (i, r) in inputs {
        let n = r.ty.words();
        match spans.last_mut() {
            Some(s)
                if u32::from(s.start) + u32::from(s.count) == u32::from(r.address)
                    && s.count + n <= MAX_READ =>
            {
                s.count += n;
                s.registers.push(i);
            }
            _ => spans.push(Span {
                start: r.address,
                count: n,
                registers: std::vec![i],
            }),
        }
    }
    spans
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Type;

    fn input(address: u16, ty: Type) -> Register<&'static str> {
        Register {
            name: "r",
            kind: Kind::Input,
            address,
            ty,
            scale: 1.0,
            unit: "",
            min: None,
            max: None,
            description: "",
        }
    }

    #[test]
    fn contiguous_inputs_are_one_read_and_a_gap_or_the_limit_starts_another() {
        let holding = Register {
            kind: Kind::Holding,
            ..input(2, Type::U16)
        };
        // Given out of address order: 0 (u32, 2 words), 5, a holding at 2,
        // then 2 and 3 contiguous with the first.
        let regs = [
            input(5, Type::U16),
            input(0, Type::U32),
            holding,
            input(3, Type::I16),
            input(2, Type::U16),
        ];
        let spans = input_spans(&regs);
        let got: Vec<_> = spans
            .iter()
            .map(|s| (s.start, s.count, s.registers.clone()))
            .collect();
        assert_eq!(
            got,
            [(0, 4, std::vec![1, 4, 3]), (5, 1, std::vec![0])],
            "0..4 in one read, 5 after the gap at 4; the holding register in none"
        );
        // 126 contiguous single registers: 125 in the first read.
        let many: Vec<_> = (0..126).map(|a| input(a, Type::U16)).collect();
        let spans = input_spans(&many);
        assert_eq!(
            spans.iter().map(|s| (s.start, s.count)).collect::<Vec<_>>(),
            [(0, MAX_READ), (125, 1)]
        );
    }
}
