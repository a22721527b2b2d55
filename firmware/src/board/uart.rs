//! The CMSDK APB UART (Arm DDI 0479C, 4.6): bytes in by interrupt into a
//! ring the main loop reads, bytes out by polling the transmit buffer.
//! Implements `embedded-hal-nb`'s serial traits (the Modbus master waits
//! byte by byte with its own deadlines), `core::fmt::Write` (the
//! console's lines) and [`Uart::send_from`], which moves queued frames
//! out only while the UART takes them (the gateway link and the trace:
//! never a wait).
//!
//! Registers: DATA (+0x00), STATE (+0x04: bit 0 TX full, bit 1 RX full,
//! bit 3 RX overrun), CTRL (+0x08: bit 0 TX enable, bit 1 RX enable,
//! bit 3 RX interrupt enable), INTSTATUS/INTCLEAR (+0x0C: bit 1 RX),
//! BAUDDIV (+0x10: SYSCLK / baud, at least 16).
//!
//! Glossary:
//! - *ring*: the bytes received and not yet read, filled by the receive
//!   interrupt; a byte that finds it full is dropped and the next read
//!   reports an overrun. The gateway's holds more than its longest frame.

use core::cell::RefCell;
use core::sync::atomic::{AtomicBool, Ordering};

use cortex_m::interrupt::{self, Mutex};
use embedded_hal_nb::nb;
use embedded_hal_nb::serial::{self, ErrorKind, ErrorType};
use heapless::Deque;

use super::{
    read, write, Irq, SYSTEM_CLOCK_HZ, UART_CONSOLE, UART_GATEWAY, UART_MODBUS, UART_TRACE,
};
use crate::outbound::TxQueue;

const DATA: u32 = 0x00;
const STATE: u32 = 0x04;
const CTRL: u32 = 0x08;
const INTCLEAR: u32 = 0x0C;
const BAUDDIV: u32 = 0x10;

const STATE_TX_FULL: u32 = 1 << 0;
const STATE_RX_FULL: u32 = 1 << 1;
const STATE_RX_OVERRUN: u32 = 1 << 3;
const CTRL_TX_EN: u32 = 1 << 0;
const CTRL_RX_EN: u32 = 1 << 1;
const CTRL_RX_INT_EN: u32 = 1 << 3;
const INT_RX: u32 = 1 << 1;

/// Bytes the Modbus ring holds: more than the longest RTU frame.
pub const MODBUS_RING_BYTES: usize = 512;
/// Bytes the gateway's ring holds: host reports for most of a step's
/// Modbus waits (the ring is read between steps and at each step's
/// start; five of the link's longest frames).
pub const GATEWAY_RING_BYTES: usize = 8192;
/// Bytes the console's and the trace's rings hold (nothing is read from
/// them).
const OTHER_RING_BYTES: usize = 16;

struct Ring<const N: usize> {
    bytes: Mutex<RefCell<Deque<u8, N>>>,
    overrun: AtomicBool,
}

impl<const N: usize> Ring<N> {
    const fn new() -> Self {
        Self {
            bytes: Mutex::new(RefCell::new(Deque::new())),
            overrun: AtomicBool::new(false),
        }
    }
}

/// The board's four UARTs, by index.
const UARTS: [super::Uart; 4] = [UART_MODBUS, UART_GATEWAY, UART_CONSOLE, UART_TRACE];
static RING_MODBUS: Ring<MODBUS_RING_BYTES> = Ring::new();
static RING_GATEWAY: Ring<GATEWAY_RING_BYTES> = Ring::new();
static RING_CONSOLE: Ring<OTHER_RING_BYTES> = Ring::new();
static RING_TRACE: Ring<OTHER_RING_BYTES> = Ring::new();

/// Runs `f` on UART `i`'s ring.
fn ring<R>(i: usize, f: impl Fn(&dyn RingOps) -> R) -> R {
    match i {
        0 => f(&RING_MODBUS),
        1 => f(&RING_GATEWAY),
        2 => f(&RING_CONSOLE),
        _ => f(&RING_TRACE),
    }
}

/// A ring of any size.
trait RingOps {
    /// Adds a received byte; a full ring drops it and marks an overrun.
    fn push(&self, b: u8);
    fn pop(&self) -> Option<u8>;
    fn is_empty(&self) -> bool;
    fn overrun(&self) -> &AtomicBool;
}

impl<const N: usize> RingOps for Ring<N> {
    fn push(&self, b: u8) {
        let full = interrupt::free(|cs| self.bytes.borrow(cs).borrow_mut().push_back(b).is_err());
        if full {
            self.overrun.store(true, Ordering::Relaxed);
        }
    }

    fn pop(&self) -> Option<u8> {
        interrupt::free(|cs| self.bytes.borrow(cs).borrow_mut().pop_front())
    }

    fn is_empty(&self) -> bool {
        interrupt::free(|cs| self.bytes.borrow(cs).borrow().is_empty())
    }

    fn overrun(&self) -> &AtomicBool {
        &self.overrun
    }
}

/// One of the board's UARTs.
#[derive(Debug)]
pub struct Uart {
    base: u32,
    ring: usize,
}

impl Uart {
    fn open(index: usize) -> Self {
        let u = &UARTS[index];
        // SAFETY: the base is a CMSDK UART of this board (board file); the
        // divider is checked at build time to be at least 16.
        unsafe {
            write(u.base + CTRL, 0);
            write(u.base + BAUDDIV, SYSTEM_CLOCK_HZ / u.baud);
            write(u.base + INTCLEAR, 0xF);
            write(u.base + CTRL, CTRL_TX_EN | CTRL_RX_EN | CTRL_RX_INT_EN);
            cortex_m::peripheral::NVIC::unmask(Irq(u.rx_irq));
        }
        Self {
            base: u.base,
            ring: index,
        }
    }

    /// UART0: Modbus RTU to the CDU. Call once.
    pub fn modbus() -> Self {
        Self::open(0)
    }

    /// UART1: the gateway link. Call once.
    pub fn gateway() -> Self {
        Self::open(1)
    }

    /// UART2: the console. Call once.
    pub fn console() -> Self {
        Self::open(2)
    }

    /// UART3: the debug port's trace. Call once.
    pub fn trace() -> Self {
        Self::open(3)
    }

    /// Moves bytes from `q` into the UART while it takes them; returns
    /// how many went.
    pub fn send_from<const N: usize>(&mut self, q: &mut TxQueue<N>) -> usize {
        let mut sent = 0;
        while let Some(b) = q.front() {
            if serial::Write::write(self, b).is_err() {
                break;
            }
            q.pop();
            sent += 1;
        }
        sent
    }
}

/// Moves received bytes into the ring of the UART whose receive
/// interrupt `irq` is; called by the board's interrupt dispatch.
pub fn on_rx_interrupt(irq: u8) {
    if let Some(i) = UARTS.iter().position(|u| u.rx_irq == irq) {
        drain(i);
    }
}

/// Moves what UART `i` holds into its ring. The interrupt is cleared
/// before the holding register is read, so a byte that arrives after the
/// last read raises it again.
fn drain(i: usize) {
    let base = UARTS[i].base;
    ring(i, |ring| {
        // SAFETY: the UART's own registers.
        unsafe {
            write(base + INTCLEAR, INT_RX);
            while read(base + STATE) & STATE_RX_FULL != 0 {
                ring.push(read(base + DATA) as u8);
            }
            if read(base + STATE) & STATE_RX_OVERRUN != 0 {
                ring.overrun().store(true, Ordering::Relaxed);
                write(base + STATE, STATE_RX_OVERRUN);
            }
        }
    })
}

/// Whether the CDU or the gateway has sent bytes not yet read (checked
/// with interrupts off before sleeping, so no byte is slept past).
pub fn any_received() -> bool {
    // The console's and the trace's bytes are never read: not counted.
    (0..2).any(|i| !ring(i, |r| r.is_empty()))
}

/// Whether the gateway has sent bytes not yet read.
pub fn gateway_received() -> bool {
    !ring(1, |r| r.is_empty())
}

impl ErrorType for Uart {
    type Error = ErrorKind;
}

/// A UART's receiving side alone: it reads the UART's ring, so that
/// what the gateway sent can be read while the rest of the board's shell
/// is borrowed (a copy reads the same ring).
#[derive(Debug, Clone, Copy)]
pub struct Receiver {
    ring: usize,
}

impl Uart {
    /// This UART's receiving side.
    pub fn receiver(&self) -> Receiver {
        Receiver { ring: self.ring }
    }
}

impl ErrorType for Receiver {
    type Error = ErrorKind;
}

impl serial::Read<u8> for Uart {
    fn read(&mut self) -> nb::Result<u8, ErrorKind> {
        self.receiver().read()
    }
}

impl serial::Read<u8> for Receiver {
    fn read(&mut self) -> nb::Result<u8, ErrorKind> {
        let i = self.ring;
        if ring(i, |r| r.overrun().swap(false, Ordering::Relaxed)) {
            return Err(nb::Error::Other(ErrorKind::Overrun));
        }
        // A byte the interrupt has not moved yet is taken here.
        ring(i, |r| r.pop())
            .or_else(|| {
                interrupt::free(|_| drain(i));
                ring(i, |r| r.pop())
            })
            .ok_or(nb::Error::WouldBlock)
    }
}

impl serial::Write<u8> for Uart {
    fn write(&mut self, b: u8) -> nb::Result<(), ErrorKind> {
        // SAFETY: this UART's own registers.
        unsafe {
            if read(self.base + STATE) & STATE_TX_FULL != 0 {
                return Err(nb::Error::WouldBlock);
            }
            write(self.base + DATA, u32::from(b));
        }
        Ok(())
    }

    fn flush(&mut self) -> nb::Result<(), ErrorKind> {
        // SAFETY: this UART's own registers.
        if unsafe { read(self.base + STATE) } & STATE_TX_FULL != 0 {
            return Err(nb::Error::WouldBlock);
        }
        Ok(())
    }
}

impl core::fmt::Write for Uart {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        for b in s.bytes() {
            nb::block!(serial::Write::write(self, b)).map_err(|_| core::fmt::Error)?;
        }
        Ok(())
    }
}
