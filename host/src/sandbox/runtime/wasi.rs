//! The WASI capability: WASI preview 2 with an empty context.
//!
//! Rust guests need WASI to start (their standard library imports it), so
//! it is linked, but it grants nothing: no preopened directory, no
//! environment variables, no arguments, no network (TCP, UDP and name
//! lookup denied), clocks frozen at zero, and random bytes that are a
//! function of the call ([`WasiState::reseed`]), so a module's behaviour
//! depends on its input alone. As no time passes, a sleep (a subscription
//! to the monotonic clock) is ready at once: waiting happens inside the
//! host, where the CPU budget cannot interrupt it, so a module must not be
//! able to wait. Standard output is discarded. Standard
//! error is kept as a bounded tail: printing never fails a call, and a
//! trap's report shows the latest output (where a Rust panic message
//! lands).
//!
//! **Random bytes are deterministic per call.** `get-random-bytes`,
//! `get-random-u64` and their `insecure` twins draw from one ChaCha8
//! generator that every call starts afresh from a seed of its input (the
//! export, the tag, the key and a bounded part of the bodies:
//! [`call_seed`]); the insecure
//! seed is 0. A module that asks for randomness (Rust's `HashMap` does)
//! therefore does the same thing every time it is given the same events:
//! a replay, a rebuild and a retry see what the first run saw. They are
//! not secret: a module must not use them for keys or tokens.
//!
//! What WASI makes in the host is bounded, so a module cannot make the
//! host hold more than its own memory limit says:
//! - `random-size`: one call of `get-random-bytes` or
//!   `get-insecure-random-bytes` asks for at most [`MAX_RANDOM_BYTES`]
//!   (the host makes the bytes before the guest has room for them;
//!   wasmtime-wasi's own default is 64 MiB); asking for more traps the
//!   call, naming the rule.
//! - `wasi-resources`: the host keeps at most [`MAX_WASI_RESOURCES`]
//!   WASI resources (pollables, streams, stream errors) of one store at
//!   once, until the module drops them (wasmtime's own default is a
//!   million); opening one more traps the call, naming the rule, and the
//!   trap's fresh instance starts with none.

use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use rand::SeedableRng as _;
use rand_chacha::ChaCha8Rng;
use tokio::io::AsyncWrite;
use wasmtime::component::{Linker, Resource, ResourceTable};
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::bindings::random;
use wasmtime_wasi::p2::{DynPollable, OutputStream, Pollable, StreamResult, subscribe};
use wasmtime_wasi::random::WasiRandomCtx;
use wasmtime_wasi::{HostMonotonicClock, HostWallClock, WasiCtx, WasiCtxView, WasiView};

use super::StoreData;

/// Bytes of a guest's stderr kept for error reports (the tail of the call
/// that failed).
const STDERR_TAIL: usize = 4 << 10;

/// Most random bytes one WASI call may ask for (rule `random-size`).
pub const MAX_RANDOM_BYTES: u64 = 64 << 10;

/// Most WASI resources the host keeps for one store at once (rule
/// `wasi-resources`): pollables (a clock's pollable counts twice: it
/// keeps what it polls), streams and stream errors.
pub const MAX_WASI_RESOURCES: usize = 1_000;

/// The trap reason of a call that opened one WASI resource too many.
pub(super) fn too_many_resources() -> String {
    format!(
        "wasi-resources: the host keeps at most {MAX_WASI_RESOURCES} WASI resources (pollables, streams, errors) of \
         one instance at once; drop them when done"
    )
}

/// A WASI call asked for more random bytes than [`MAX_RANDOM_BYTES`]; it
/// traps the call.
#[derive(Debug, thiserror::Error)]
#[error("random-size: one WASI call may ask for at most {MAX_RANDOM_BYTES} random bytes; this one asked for {asked}")]
pub struct RandomSize {
    /// The bytes asked for.
    pub asked: u64,
}

/// The random interfaces as wasmtime-wasi links them, with the function
/// of each that makes bytes (a test checks that asking for too many
/// names the rule, so a version change that misses them fails there).
const RANDOM: [(&str, &str); 2] =
    [("wasi:random/random@0.2.12", "get-random-bytes"), ("wasi:random/insecure@0.2.12", "get-insecure-random-bytes")];

/// The monotonic clock interface as wasmtime-wasi links it (a test
/// checks that a sleep through it ends at once, so a version change that
/// misses it fails there).
const MONOTONIC_CLOCK: &str = "wasi:clocks/monotonic-clock@0.2.12";

/// Links all of WASI preview 2; what it can reach is decided by the
/// context each store gets ([`WasiState::new`]), the monotonic clock's
/// subscriptions are replaced by ones that are ready at once, and random
/// bytes are asked for [`MAX_RANDOM_BYTES`] at most.
pub(super) fn link(linker: &mut Linker<StoreData>) -> wasmtime::Result<()> {
    wasmtime_wasi::p2::add_to_linker_sync(linker)?;
    linker.allow_shadowing(true);
    let mut clock = linker.instance(MONOTONIC_CLOCK)?;
    clock.func_wrap("subscribe-duration", |mut store, (_,): (u64,)| ready_now(store.data_mut()))?;
    clock.func_wrap("subscribe-instant", |mut store, (_,): (u64,)| ready_now(store.data_mut()))?;
    let [(random, random_bytes), (insecure, insecure_bytes)] = RANDOM;
    linker.instance(random)?.func_wrap(random_bytes, |mut store, (asked,): (u64,)| {
        let random = checked_random(store.data_mut(), asked)?;
        Ok((random::random::Host::get_random_bytes(random, asked)?,))
    })?;
    linker.instance(insecure)?.func_wrap(insecure_bytes, |mut store, (asked,): (u64,)| {
        let random = checked_random(store.data_mut(), asked)?;
        Ok((random::insecure::Host::get_insecure_random_bytes(random, asked)?,))
    })?;
    linker.allow_shadowing(false);
    Ok(())
}

/// The store's random generators, when `asked` is within
/// [`MAX_RANDOM_BYTES`].
fn checked_random(data: &mut StoreData, asked: u64) -> wasmtime::Result<&mut WasiRandomCtx> {
    if asked > MAX_RANDOM_BYTES {
        return Err(RandomSize { asked }.into());
    }
    Ok(data.wasi.ctx.random())
}

/// A pollable that is ready at once: what a subscription to a frozen
/// clock gives.
fn ready_now(data: &mut StoreData) -> wasmtime::Result<(Resource<DynPollable>,)> {
    let table = &mut data.wasi.table;
    let ready = table.push(Ready)?;
    Ok((subscribe(table, ready)?,))
}

/// See [`ready_now`].
struct Ready;

#[async_trait::async_trait]
impl Pollable for Ready {
    async fn ready(&mut self) {}
}

/// The seed of a call's random bytes: SipHash-1-3 (fixed keys, so the
/// same on every host and version) of the export's name, the tag, the key,
/// how many bodies there are and their total length, and the first
/// [`SEEDED_BODY_BYTES`] bytes of the first and of the last body. Only a
/// bounded part of the bodies, so seeding costs the same whatever the
/// chunk holds: a call's cost is not raised for the modules that never
/// ask for random bytes (most of them).
pub(super) fn call_seed(export: &str, tag: u32, key: &[u8], bodies: &[impl AsRef<[u8]>]) -> u64 {
    use std::hash::Hasher as _;
    let mut hasher = siphasher::sip::SipHasher13::new_with_keys(0x7761_6b75, 0x7761_6b75);
    let total: usize = bodies.iter().map(|body| body.as_ref().len()).sum();
    let (first, last) = (seeded_head(bodies.first()), seeded_head(bodies.last()));
    for part in [export.as_bytes(), &tag.to_le_bytes(), &(key.len() as u64).to_le_bytes(), key] {
        hasher.write(part);
    }
    for count in [bodies.len(), total, first.len()] {
        hasher.write(&(count as u64).to_le_bytes());
    }
    hasher.write(first);
    hasher.write(last);
    hasher.finish()
}

/// The part of a body that seeds a call's random bytes.
fn seeded_head(body: Option<&impl AsRef<[u8]>>) -> &[u8] {
    body.map_or(&[], |body| &body.as_ref()[..body.as_ref().len().min(SEEDED_BODY_BYTES)])
}

/// `mutex`'s value; a panic while it was held left nothing half-done
/// that matters here.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// How much of each body seeds a call's random bytes.
const SEEDED_BODY_BYTES: usize = 64;

/// The generator both random interfaces of one store draw from: the
/// seed of the call running, and the generator made from it when the call
/// first asks (most calls never do, so they never pay for one).
#[derive(Clone)]
struct CallRandom(Arc<Mutex<(u64, Option<ChaCha8Rng>)>>);

impl CallRandom {
    /// Runs `draw` on the call's generator, made from its seed first.
    fn draw<T>(&self, draw: impl FnOnce(&mut ChaCha8Rng) -> T) -> T {
        let mut guard = lock(&self.0);
        let (seed, generator) = &mut *guard;
        draw(generator.get_or_insert_with(|| ChaCha8Rng::seed_from_u64(*seed)))
    }
}

impl rand::TryRng for CallRandom {
    type Error = std::convert::Infallible;

    fn try_next_u32(&mut self) -> Result<u32, Self::Error> {
        Ok(self.draw(rand::Rng::next_u32))
    }

    fn try_next_u64(&mut self) -> Result<u64, Self::Error> {
        Ok(self.draw(rand::Rng::next_u64))
    }

    fn try_fill_bytes(&mut self, bytes: &mut [u8]) -> Result<(), Self::Error> {
        self.draw(|generator| rand::Rng::fill_bytes(generator, bytes));
        Ok(())
    }
}

/// One store's WASI context, its resource table, its stderr tail and the
/// generator of its random bytes.
pub(super) struct WasiState {
    ctx: WasiCtx,
    table: ResourceTable,
    stderr: Tail,
    random: CallRandom,
}

impl WasiState {
    /// The empty context: nothing granted, clocks frozen, stderr kept.
    pub(super) fn new() -> Self {
        let stderr = Tail::new(STDERR_TAIL);
        let random = CallRandom(Arc::new(Mutex::new((0, None))));
        let ctx = WasiCtx::builder()
            .secure_random(random.clone())
            .insecure_random(random.clone())
            .insecure_random_seed(0)
            .stderr(stderr.clone())
            .wall_clock(FrozenClock)
            .monotonic_clock(FrozenClock)
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .max_random_size(MAX_RANDOM_BYTES)
            .build();
        let mut table = ResourceTable::new();
        table.set_max_capacity(MAX_WASI_RESOURCES);
        Self { ctx, table, stderr, random }
    }

    /// Starts the random bytes of the next call from `seed`
    /// ([`call_seed`]).
    pub(super) fn reseed(&self, seed: u64) {
        *lock(&self.random.0) = (seed, None);
    }

    /// The guest's latest stderr output, as text.
    pub(super) fn stderr(&self) -> String {
        self.stderr.contents()
    }

    /// Forgets the stderr output (before each call).
    pub(super) fn clear_stderr(&self) {
        self.stderr.clear();
    }
}

impl WasiView for StoreData {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi.ctx, table: &mut self.wasi.table }
    }
}

/// A clock that never moves: modules get no time unless the host grants it.
struct FrozenClock;

impl HostWallClock for FrozenClock {
    fn resolution(&self) -> Duration {
        Duration::from_secs(1)
    }
    fn now(&self) -> Duration {
        Duration::ZERO
    }
}

impl HostMonotonicClock for FrozenClock {
    fn resolution(&self) -> u64 {
        1_000_000_000
    }
    fn now(&self) -> u64 {
        0
    }
}

/// A shared, bounded tail of everything written.
#[derive(Clone)]
pub(super) struct Tail {
    bytes: Arc<Mutex<VecDeque<u8>>>,
    capacity: usize,
}

impl Tail {
    pub(super) fn new(capacity: usize) -> Self {
        Self { bytes: Arc::default(), capacity }
    }

    fn lock(&self) -> MutexGuard<'_, VecDeque<u8>> {
        self.bytes.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn push(&self, data: &[u8]) {
        let mut bytes = self.lock();
        let data = &data[data.len().saturating_sub(self.capacity)..];
        let overflow = (bytes.len() + data.len()).saturating_sub(self.capacity);
        bytes.drain(..overflow);
        bytes.extend(data);
    }

    /// Forgets what was written (before each call).
    pub(super) fn clear(&self) {
        self.lock().clear();
    }

    /// What is kept, as text.
    pub(super) fn contents(&self) -> String {
        let bytes = self.lock();
        let (front, back) = bytes.as_slices();
        String::from_utf8_lossy(&[front, back].concat()).into_owned()
    }
}

impl IsTerminal for Tail {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for Tail {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

impl OutputStream for Tail {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.push(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(64 << 10)
    }
}

#[async_trait::async_trait]
impl Pollable for Tail {
    async fn ready(&mut self) {}
}

impl AsyncWrite for Tail {
    fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        self.push(data);
        Poll::Ready(Ok(data.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_last_bytes_and_never_refuses() {
        let tail = Tail::new(8);
        let mut stream = tail.p2_stream();
        for chunk in ["0123", "4567", "89ab"] {
            stream.write(Bytes::from(chunk)).unwrap();
        }
        assert_eq!(tail.contents(), "456789ab");
        stream.write(Bytes::from("a longer line than the tail")).unwrap();
        assert_eq!(tail.contents(), "the tail");
        tail.clear();
        assert_eq!(tail.contents(), "");
    }
}
