//! The memory limit of one module instance, over all its linear memories.
//!
//! wasmtime's [`StoreLimits`] bounds each linear memory on its own, and a
//! component may define many (one per core module, or several in one with
//! multi-memory): with the instance limit of 100 and 64 MiB each, one
//! instance could hold 6.4 GiB. [`InstanceLimits`] keeps the sum of every
//! memory of the store within [`SandboxLimits::memory_bytes`] and leaves
//! the other limits (tables, instances, memories) to [`StoreLimits`].
//!
//! Rules kept here:
//! - Memories only grow, so the store's memory is the sum of what each
//!   growth added; a growth past the limit is refused and, as
//!   [`StoreLimits`] is built to, traps (at instantiation it fails it).
//! - A refused growth adds nothing.
//!
//! [`SandboxLimits::memory_bytes`]: super::SandboxLimits::memory_bytes

use wasmtime::{ResourceLimiter, StoreLimits};

/// A store's limits: [`StoreLimits`] plus the sum of its memories. The
/// default limits nothing.
pub(crate) struct InstanceLimits {
    store: StoreLimits,
    /// The most bytes all linear memories of the store may hold together.
    memory_bytes: usize,
    /// What they hold now.
    memory_held: usize,
}

impl InstanceLimits {
    /// `store`'s limits, with all memories together held to `memory_bytes`.
    pub(crate) fn new(store: StoreLimits, memory_bytes: usize) -> Self {
        Self { store, memory_bytes, memory_held: 0 }
    }
}

impl Default for InstanceLimits {
    fn default() -> Self {
        Self::new(StoreLimits::default(), usize::MAX)
    }
}

impl ResourceLimiter for InstanceLimits {
    fn memory_growing(&mut self, current: usize, desired: usize, maximum: Option<usize>) -> wasmtime::Result<bool> {
        let held = self.memory_held.saturating_sub(current).saturating_add(desired);
        if held > self.memory_bytes {
            // Refused the way `StoreLimits` refuses one memory's growth.
            return self.store.memory_growing(current, usize::MAX, maximum);
        }
        let allowed = self.store.memory_growing(current, desired, maximum)?;
        if allowed {
            self.memory_held = held;
        }
        Ok(allowed)
    }

    fn memory_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        self.store.memory_grow_failed(error)
    }

    fn table_growing(&mut self, current: usize, desired: usize, maximum: Option<usize>) -> wasmtime::Result<bool> {
        self.store.table_growing(current, desired, maximum)
    }

    fn table_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        self.store.table_grow_failed(error)
    }

    fn instances(&self) -> usize {
        self.store.instances()
    }

    fn tables(&self) -> usize {
        self.store.tables()
    }

    fn memories(&self) -> usize {
        self.store.memories()
    }
}

#[cfg(test)]
mod tests {
    use wasmtime::StoreLimitsBuilder;

    use super::*;

    const MIB: usize = 1 << 20;

    fn limits() -> InstanceLimits {
        let store = StoreLimitsBuilder::new().memory_size(64 * MIB).trap_on_grow_failure(true).build();
        InstanceLimits::new(store, 64 * MIB)
    }

    #[test]
    fn memories_share_one_limit() {
        let mut limits = limits();
        assert!(limits.memory_growing(0, 40 * MIB, None).unwrap());
        assert!(limits.memory_growing(0, 20 * MIB, None).unwrap());
        // A second memory of 40 MiB would be within the per-memory limit.
        assert!(limits.memory_growing(0, 40 * MIB, None).is_err(), "the store would hold 100 MiB");
        // The refusal added nothing: the first memory can still grow to the limit.
        assert!(limits.memory_growing(40 * MIB, 44 * MIB, None).unwrap());
        assert!(limits.memory_growing(44 * MIB, 45 * MIB, None).is_err());
    }

    #[test]
    fn one_memory_keeps_its_own_limit() {
        let mut limits = limits();
        assert!(limits.memory_growing(0, 64 * MIB, None).unwrap());
        assert!(limits.memory_growing(64 * MIB, 64 * MIB + 1, None).is_err());
        assert!(limits.memory_growing(0, usize::MAX, None).is_err(), "no overflow");
    }
}
