//! The bank example (`examples/bank`) with its `withdrawal-fee` feature on:
//! every withdrawal also takes [`bank::WITHDRAWAL_FEE`] from the balance.
//! The rebuild tests rebuild a bank projection with it, as a fix of the
//! handler's logic would be rolled out.

#[path = "../../../../examples/bank/src/lib.rs"]
pub mod bank;
