//! Runs a future to completion on the spot. The flash crate's stores are
//! `async` (generic over `embedded-storage-async`); the board's NOR
//! completes every operation when called, so a future here is ready
//! after a few polls and needs no executor, no waker and no interrupt.
//!
//! Glossary:
//! - *poll*: asking a future whether it has finished; a pending one is
//!   asked again at once.

use core::future::Future;
use core::pin::pin;
use core::task::{Context, Poll, Waker};

/// `f`'s output, polling it until it is ready.
pub fn block_on<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_future_that_yields_finishes() {
        struct YieldTwice(u8);
        impl Future for YieldTwice {
            type Output = u8;
            fn poll(mut self: core::pin::Pin<&mut Self>, _: &mut Context<'_>) -> Poll<u8> {
                self.0 += 1;
                if self.0 < 3 {
                    Poll::Pending
                } else {
                    Poll::Ready(self.0)
                }
            }
        }
        assert_eq!(block_on(YieldTwice(0)), 3);
        assert_eq!(block_on(async { 41 + 1 }), 42);
    }
}
