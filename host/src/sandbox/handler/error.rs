//! Why a call into a handler fails, and what follows from it: the class
//! that decides where the events go ([`CallError::class`]) and whether the
//! failure counts as the key's attempt ([`CallError::counts_as_attempt`]).
//!
//! Rules kept here:
//! - **Host faults are not the module's.** A state read that fails in the
//!   host fails the call as [`CallError::HostFault`], which the consumer
//!   never counts against the module.
//! - **Limits the host decides are retryable.** The batch budget, the
//!   host's instance memory and the module time per batch fail a call as
//!   retryable, so its key is tried again in a later batch.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::{ContractError, Refusal};

/// The kind of failure a handler reports; it decides where events go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ErrorClass {
    /// May succeed right away: retried in place.
    Transient,
    /// May succeed later.
    Retryable,
    /// Will never succeed.
    Unrecoverable,
}

impl fmt::Display for ErrorClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Transient => "transient",
            Self::Retryable => "retryable",
            Self::Unrecoverable => "unrecoverable",
        })
    }
}

/// Why a call into a handler did not succeed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CallError {
    /// The handler returned an error (its message cut to
    /// [`wakuwaku_core::limits::MAX_ERROR_MESSAGE_BYTES`]).
    #[error("{class} handler error: {message}")]
    Handler {
        /// What kind of failure the handler reported.
        class: ErrorClass,
        /// The handler's message.
        message: String,
    },
    /// The guest trapped: a panic, out of CPU budget, a memory limit, a
    /// stack overflow, a value the host could not lift. The instance is
    /// replaced before its next call.
    #[error("module trapped: {reason}")]
    Trap {
        /// What the trap was, with the guest's last stderr output if any.
        reason: String,
    },
    /// The module returned a value the host cannot use (a key that is not
    /// canonical, an oversized `combine` body); the message names the rule.
    #[error("the module broke the contract: {0}")]
    Contract(ContractError),
    /// The call would take what the batch holds past the batch's budget
    /// ([`PayloadLimits::max_batch_held`]). Decided by the host, not the
    /// module: retryable, so the key is tried again in a later batch.
    #[error(
        "batch-budget: the batch already holds {held} bytes of state writes and emits and this call adds {adds}, \
         over the budget of {limit} bytes; the key is tried again in a later batch"
    )]
    BatchBudget {
        /// What the batch held before the call.
        held: usize,
        /// What the call would add.
        adds: usize,
        /// The budget.
        limit: usize,
        /// What the call's own key held of it before the call.
        key_held: usize,
    },
    /// A call of this batch already found its budget spent
    /// ([`CallError::BatchBudget`]), so this call was not made. Decided by
    /// the host: retryable, and not the key's attempt.
    #[error(
        "batch-budget: an earlier call of this batch found its budget of {limit} bytes spent, so the key was not \
         called; it is tried again in a later batch"
    )]
    BatchBudgetSpent {
        /// The budget.
        limit: usize,
    },
    /// The instance asked for linear memory that the host's cap on what all
    /// instances hold together ([`SandboxLimits::host_memory_bytes`]) could
    /// not give. Decided by the host: retryable, and the key's attempt only
    /// when the instance itself holds more than a quarter of the cap, as
    /// for the batch budget.
    ///
    /// [`SandboxLimits::host_memory_bytes`]: crate::sandbox::runtime::SandboxLimits::host_memory_bytes
    #[error(
        "host-instance-memory: module instances hold {held} bytes together and this one (holding {instance_held}) \
         asked for {adds} more, over the host's {limit} bytes for all instances (--host-memory-mib); the key is \
         tried again in a later batch"
    )]
    HostMemory {
        /// What all instances held.
        held: usize,
        /// What the instance asked for.
        adds: usize,
        /// What the instance held.
        instance_held: usize,
        /// The host's cap.
        limit: usize,
    },
    /// The module's calls in this batch have already run longer than the
    /// batch allows one module (`ConsumerConfig::module_time_per_batch`), so
    /// the call was not made. Decided by the host: retryable, and not the
    /// key's attempt, so a slow module delays its own keys to later batches
    /// instead of holding up the partition.
    #[error(
        "batch-module-time: module `{module}` has run for {spent_ms} ms of calls in this batch, over the \
         {limit_ms} ms one module may take per batch; the key is tried again in a later batch"
    )]
    BatchTime {
        /// The module.
        module: String,
        /// How long its calls in the batch took, in milliseconds.
        spent_ms: u128,
        /// What one module may take per batch, in milliseconds.
        limit_ms: u128,
    },
    /// The host's own state store failed under the call. Not the module's
    /// doing: the consumer does not commit the batch and tries it again,
    /// and counts nothing against the module.
    #[error("host-fault: {0}")]
    HostFault(String),
}

impl CallError {
    /// The class that decides where the failed events go. A trap, a broken
    /// contract, the batch budget and a host fault are retryable: the
    /// module may be fixed, a limit raised, the batch smaller, the store
    /// back.
    pub fn class(&self) -> ErrorClass {
        match self {
            Self::Handler { class, .. } => *class,
            Self::Trap { .. }
            | Self::Contract(_)
            | Self::BatchBudget { .. }
            | Self::BatchBudgetSpent { .. }
            | Self::HostMemory { .. }
            | Self::BatchTime { .. }
            | Self::HostFault(_) => ErrorClass::Retryable,
        }
    }
}

impl CallError {
    /// Whether the failure is the key's own doing, so that it counts as an
    /// attempt (and, past the most attempts, dead-letters the events).
    ///
    /// A call that finds the batch's budget used up counts only when its
    /// key holds more than a fair share of it (a quarter, with the call):
    /// a module flooding one key uses up that key's attempts, while the
    /// keys that merely share its batch are retried without losing any.
    /// A key that could never fit a batch on its own is therefore
    /// dead-lettered in the end, never retried forever. A call cut because
    /// its module used up its time in the batch never counts: the key was
    /// not called, and every batch makes at least one call of each module,
    /// so the keys it delays are all reached in the end.
    pub fn counts_as_attempt(&self) -> bool {
        match self {
            Self::BatchBudget { adds, limit, key_held, .. } => key_held.saturating_add(*adds) > limit / 4,
            Self::HostMemory { adds, limit, instance_held, .. } => instance_held.saturating_add(*adds) > limit / 4,
            // The key was not even called.
            Self::BatchTime { .. } | Self::BatchBudgetSpent { .. } => false,
            _ => true,
        }
    }
}

impl From<ContractError> for CallError {
    fn from(error: ContractError) -> Self {
        Self::Contract(error)
    }
}

/// What the state capability answers besides a value: a refusal the module
/// sees, or a host fault, which fails the call whatever the module does.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ScopeError {
    /// The value broke a rule.
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// The host's state store failed.
    #[error("host-fault: the host's state store failed: {0}")]
    HostFault(String),
}
