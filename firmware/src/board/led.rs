//! The FPGA's user LEDs (the MPS2 FPGA system I/O block, FPGAIO LED0
//! register at +0x00, one bit per LED) as `embedded-hal` output pins.
//! The firmware blinks one each completed step and lights another while
//! a rack's leak is latched. QEMU models the register (its trace shows
//! the LEDs); a real board wires them to its front panel.
//!
//! Glossary:
//! - *pin*: one LED's bit.

use core::convert::Infallible;

use embedded_hal::digital::{ErrorType, OutputPin, StatefulOutputPin};

use super::{read, write, FPGAIO_BASE, FPGAIO_LEDS};

/// One LED.
#[derive(Debug)]
pub struct Led {
    bit: u32,
}

impl Led {
    /// LED `n` (from 0); `None` past the board's LEDs.
    pub fn new(n: u8) -> Option<Self> {
        (n < FPGAIO_LEDS).then_some(Self { bit: 1 << n })
    }

    fn set(&mut self, on: bool) {
        // SAFETY: the FPGAIO LED register of this board (board file).
        unsafe {
            let v = read(FPGAIO_BASE);
            write(FPGAIO_BASE, if on { v | self.bit } else { v & !self.bit });
        }
    }
}

impl ErrorType for Led {
    type Error = Infallible;
}

impl OutputPin for Led {
    fn set_low(&mut self) -> Result<(), Infallible> {
        self.set(false);
        Ok(())
    }

    fn set_high(&mut self) -> Result<(), Infallible> {
        self.set(true);
        Ok(())
    }
}

impl StatefulOutputPin for Led {
    fn is_set_high(&mut self) -> Result<bool, Infallible> {
        // SAFETY: a read of the FPGAIO LED register.
        Ok(unsafe { read(FPGAIO_BASE) } & self.bit != 0)
    }

    fn is_set_low(&mut self) -> Result<bool, Infallible> {
        self.is_set_high().map(|h| !h)
    }
}
