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
//! Every instance of a sandbox also draws its memories from one
//! [`HostMemory`]: the most all instances may hold together
//! ([`SandboxLimits::host_memory_bytes`]), however many modules,
//! partitions and workers make them.
//!
//! Rules kept here:
//! - Memories and tables only grow, so what the store holds is the sum of
//!   what each growth added; a growth past the limit is refused and, as
//!   [`StoreLimits`] is built to, traps (at instantiation it fails it).
//! - A refused growth adds nothing.
//! - A growth the host's memory cannot take is refused the same way, and
//!   the store remembers it ([`InstanceLimits::host_refusal`]), so the
//!   failure is named as the host's (`host-instance-memory`), not the
//!   module's own limit. What a store took is given back when it is
//!   dropped.
//! - A store made for a module version ([`InstanceLimits::counted_in`])
//!   adds each growth to that version's figures
//!   ([`super::usage::VersionUsage`]) and takes what it held off them when
//!   dropped; every refused growth is remembered until the call asks
//!   ([`InstanceLimits::take_refused`]), so a call it failed counts as out
//!   of memory.
//!
//! [`SandboxLimits::memory_bytes`]: super::SandboxLimits::memory_bytes
//! [`SandboxLimits::table_elements`]: super::SandboxLimits::table_elements
//! [`SandboxLimits::host_memory_bytes`]: super::SandboxLimits::host_memory_bytes

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use wasmtime::{ResourceLimiter, StoreLimits};

use super::usage::VersionUsage;

/// What every instance of a sandbox holds in linear memory together, and
/// the most they may.
#[derive(Debug)]
pub(crate) struct HostMemory {
    held: AtomicUsize,
    limit: usize,
}

impl HostMemory {
    /// A pool of `limit` bytes.
    pub(crate) fn new(limit: usize) -> Arc<Self> {
        Arc::new(Self { held: AtomicUsize::new(0), limit })
    }

    /// What the instances hold.
    pub(crate) fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    /// The most they may hold.
    pub(crate) fn limit(&self) -> usize {
        self.limit
    }

    /// Takes `bytes`, or says what was held when they do not fit.
    fn take(&self, bytes: usize) -> Result<(), usize> {
        self.held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                held.checked_add(bytes).filter(|&total| total <= self.limit)
            })
            .map(drop)
    }

    fn give_back(&self, bytes: usize) {
        self.held.fetch_sub(bytes, Ordering::AcqRel);
    }
}

/// A growth the host's memory could not take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HostRefusal {
    /// What all instances held.
    pub(crate) held: usize,
    /// What the growth asked for.
    pub(crate) adds: usize,
    /// What this instance held.
    pub(crate) instance_held: usize,
    /// The host's limit.
    pub(crate) limit: usize,
}

/// A store's limits: [`StoreLimits`] plus the sums of its memories and of
/// its tables, its memories drawn from the host's. The default limits
/// nothing.
pub(crate) struct InstanceLimits {
    store: StoreLimits,
    memories: Sum,
    tables: Sum,
    host: Arc<HostMemory>,
    /// The last growth the host's memory refused, if any.
    host_refusal: Option<HostRefusal>,
    /// Whether a memory growth was refused since the last
    /// [`Self::take_refused`].
    refused: bool,
    /// The figures of the module version this store's instance is of.
    usage: Option<Arc<VersionUsage>>,
}

impl Drop for InstanceLimits {
    fn drop(&mut self) {
        self.host.give_back(self.memories.held);
        if let Some(usage) = &self.usage {
            usage.instance_dropped(self.memories.held);
        }
    }
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
    /// and all tables to `table_elements`, the memories drawn from `host`.
    pub(crate) fn new(store: StoreLimits, memory_bytes: usize, table_elements: usize, host: Arc<HostMemory>) -> Self {
        Self {
            store,
            memories: Sum { held: 0, limit: memory_bytes },
            tables: Sum { held: 0, limit: table_elements },
            host,
            host_refusal: None,
            refused: false,
            usage: None,
        }
    }

    /// The same limits, adding what the store holds to `usage`, an
    /// instance of its version for as long as the store lives.
    pub(crate) fn counted_in(mut self, usage: Arc<VersionUsage>) -> Self {
        usage.instance_made();
        usage.memory_grew(self.memories.held, self.memories.held);
        self.usage = Some(usage);
        self
    }

    /// Whether a memory growth was refused since the last time this was
    /// asked.
    pub(crate) fn take_refused(&mut self) -> bool {
        std::mem::take(&mut self.refused)
    }

    /// What all memories of the store hold together, in bytes.
    pub(crate) fn memory_held(&self) -> usize {
        self.memories.held
    }

    /// The last growth the host's memory refused, if any: the failure it
    /// caused is the host's.
    pub(crate) fn host_refusal(&self) -> Option<HostRefusal> {
        self.host_refusal
    }
}

impl Default for InstanceLimits {
    fn default() -> Self {
        Self::new(StoreLimits::default(), usize::MAX, usize::MAX, HostMemory::new(usize::MAX))
    }
}

impl ResourceLimiter for InstanceLimits {
    fn memory_growing(&mut self, current: usize, desired: usize, maximum: Option<usize>) -> wasmtime::Result<bool> {
        let before = self.memories.held;
        let store = &mut self.store;
        let host = &self.host;
        let mut refused = None;
        let allowed = self.memories.grow(current, desired, |size| {
            let adds = size.saturating_sub(current);
            if size != usize::MAX
                && let Err(held) = host.take(adds)
            {
                refused = Some(HostRefusal { held, adds, instance_held: before, limit: host.limit });
                return store.memory_growing(current, usize::MAX, maximum);
            }
            let allowed = store.memory_growing(current, size, maximum);
            if !matches!(allowed, Ok(true)) && size != usize::MAX {
                host.give_back(adds);
            }
            allowed
        });
        if refused.is_some() {
            self.host_refusal = refused;
        }
        match allowed {
            Ok(true) => {
                if let Some(usage) = &self.usage {
                    usage.memory_grew(self.memories.held.saturating_sub(before), self.memories.held);
                }
            }
            _ => self.refused = true,
        }
        allowed
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
        InstanceLimits::new(store, 64 * MIB, 1000, HostMemory::new(usize::MAX))
    }

    #[test]
    fn instances_draw_on_one_host_memory_and_give_it_back_when_dropped() {
        let host = HostMemory::new(100 * MIB);
        let store = || StoreLimitsBuilder::new().memory_size(64 * MIB).trap_on_grow_failure(true).build();
        let mut first = InstanceLimits::new(store(), 64 * MIB, 1000, host.clone());
        let mut second = InstanceLimits::new(store(), 64 * MIB, 1000, host.clone());
        assert!(first.memory_growing(0, 60 * MIB, None).unwrap());
        assert!(second.memory_growing(0, 30 * MIB, None).unwrap());
        assert_eq!(host.held(), 90 * MIB);
        // Within its own limit, past the host's: refused, and named so.
        assert!(second.memory_growing(30 * MIB, 50 * MIB, None).is_err());
        let refusal = HostRefusal { held: 90 * MIB, adds: 20 * MIB, instance_held: 30 * MIB, limit: 100 * MIB };
        assert_eq!(second.host_refusal(), Some(refusal));
        assert_eq!(host.held(), 90 * MIB, "a refused growth takes nothing");
        // A growth its own limit refuses takes nothing from the host either.
        assert!(first.memory_growing(60 * MIB, 70 * MIB, None).is_err());
        assert_eq!((first.host_refusal(), host.held()), (None, 90 * MIB));
        drop(first);
        assert_eq!(host.held(), 30 * MIB);
        assert!(second.memory_growing(30 * MIB, 50 * MIB, None).unwrap());
        drop(second);
        assert_eq!(host.held(), 0);
    }

    #[test]
    fn a_counted_store_adds_its_growths_to_its_version_and_takes_them_off_when_dropped() {
        let usage = Arc::new(VersionUsage::for_tests());
        let mut limits = limits().counted_in(usage.clone());
        assert!(limits.memory_growing(0, 10 * MIB, None).unwrap());
        assert!(limits.memory_growing(10 * MIB, 12 * MIB, None).unwrap());
        assert!(!limits.take_refused());
        assert!(limits.memory_growing(12 * MIB, 65 * MIB, None).is_err());
        assert!(limits.take_refused() && !limits.take_refused(), "a refusal is told once");
        let figures = usage.figures();
        assert_eq!((figures.instances, figures.memory_bytes, figures.memory_peak_bytes), (1, 12 * MIB, 12 * MIB));
        drop(limits);
        let figures = usage.figures();
        assert_eq!((figures.instances, figures.memory_bytes, figures.memory_peak_bytes), (0, 0, 12 * MIB));
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
