//! The memory and table limits of one module instance, over all its linear
//! memories and all its tables.
//!
//! wasmtime's [`StoreLimits`] bounds each linear memory and each table on
//! its own, and a component may define many (one per core module, or
//! several in one): with the instance limit of 100 and 64 MiB each, one
//! instance could hold 6.4 GiB. [`InstanceLimits`] keeps the sum of every
//! memory of the store within [`SandboxLimits::memory_bytes`] and of every
//! table within [`SandboxLimits::table_elements`], and leaves the counts
//! (instances, memories, tables) to [`StoreLimits`].
//!
//! Rules kept here:
//! - Memories and tables only grow, so what the store holds is the sum of
//!   what each growth added; a growth past the limit is refused and, as
//!   [`StoreLimits`] is built to, traps (at instantiation it fails it).
//! - A refused growth adds nothing.
//!
//! [`SandboxLimits::memory_bytes`]: super::SandboxLimits::memory_bytes
//! [`SandboxLimits::table_elements`]: super::SandboxLimits::table_elements

use wasmtime::{ResourceLimiter, StoreLimits};

/// A store's limits: [`StoreLimits`] plus the sums of its memories and of
/// its tables. The default limits nothing.
pub(crate) struct InstanceLimits {
    store: StoreLimits,
    memories: Sum,
    tables: Sum,
}

/// What all memories (or tables) of a store hold together, and the most.
struct Sum {
    held: usize,
    limit: usize,
}

impl Sum {
    /// What the store would hold if one of them grew from `current` to
    /// `desired`, if that is within the limit.
    fn after(&self, current: usize, desired: usize) -> Option<usize> {
        Some(self.held.saturating_sub(current).saturating_add(desired)).filter(|&held| held <= self.limit)
    }

    /// Grows one of them from `current` to `desired` if the sum allows it
    /// and `growing` (`StoreLimits`' own check for one, given the size it
    /// asks for) does too. Past the sum, `growing` is asked for the largest
    /// size, so the refusal is the one `StoreLimits` gives.
    fn grow(
        &mut self,
        current: usize,
        desired: usize,
        growing: impl FnOnce(usize) -> wasmtime::Result<bool>,
    ) -> wasmtime::Result<bool> {
        let Some(held) = self.after(current, desired) else {
            return growing(usize::MAX);
        };
        let allowed = growing(desired)?;
        if allowed {
            self.held = held;
        }
        Ok(allowed)
    }
}

impl InstanceLimits {
    /// `store`'s limits, with all memories together held to `memory_bytes`
    /// and all tables to `table_elements`.
    pub(crate) fn new(store: StoreLimits, memory_bytes: usize, table_elements: usize) -> Self {
        Self { store, memories: Sum { held: 0, limit: memory_bytes }, tables: Sum { held: 0, limit: table_elements } }
    }
}

impl Default for InstanceLimits {
    fn default() -> Self {
        Self::new(StoreLimits::default(), usize::MAX, usize::MAX)
    }
}

impl ResourceLimiter for InstanceLimits {
    fn memory_growing(&mut self, current: usize, desired: usize, maximum: Option<usize>) -> wasmtime::Result<bool> {
        let store = &mut self.store;
        self.memories.grow(current, desired, |size| store.memory_growing(current, size, maximum))
    }

    fn memory_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        self.store.memory_grow_failed(error)
    }

    fn table_growing(&mut self, current: usize, desired: usize, maximum: Option<usize>) -> wasmtime::Result<bool> {
        let store = &mut self.store;
        self.tables.grow(current, desired, |size| store.table_growing(current, size, maximum))
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
        let store =
            StoreLimitsBuilder::new().memory_size(64 * MIB).table_elements(1000).trap_on_grow_failure(true).build();
        InstanceLimits::new(store, 64 * MIB, 1000)
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

    #[test]
    fn tables_share_one_limit() {
        let mut limits = limits();
        assert!(limits.table_growing(0, 600, None).unwrap());
        assert!(limits.table_growing(0, 600, None).is_err(), "the store would hold 1 200 elements");
        assert!(limits.table_growing(0, 400, None).unwrap());
        assert!(limits.table_growing(400, 401, None).is_err());
    }
}
