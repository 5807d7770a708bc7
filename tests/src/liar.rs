//! Hand-written components that break the contract in ways the SDK never
//! would: they describe themselves badly, or return values the host cannot
//! lift (out-of-bounds pointers, unknown enum cases, unknown variant
//! discriminants), or trap on every call.
//!
//! [`liar`] builds one from component text: a core module with a bump
//! allocator, lifted as the `wakuwaku:handler/handler@0.1.0` interface. It
//! imports nothing, so it loads into any sandbox. What `describe` returns is
//! chosen with [`Describe`]; the other exports answer by tag:
//!
//! | tag | name | every export |
//! | --- | --- | --- |
//! | [`TRUTH`] (100) | `Truth` | behaves: `key` is 42, `ordering` relaxed, `combine` an empty body, `handle` ok |
//! | [`LIE`] (101) | `Lie` | returns garbage: `key` an unknown result discriminant, `ordering` enum case 9, `combine` a list far out of bounds, `handle` an error whose message is out of bounds |
//! | [`TRAP`] (102) | `Trap` | executes `unreachable` |
//!
//! Any other tag behaves like [`TRUTH`]. The tags do not collide with the
//! probe module's, so a projection can hold both.
//!
//! [`other_world`] and [`wrong_shape`] are components that are not handlers
//! at all: one exports some other interface, the other exports the handler
//! interface's name with functions of the wrong types.

use wakuwaku::event::EventTypeTag;

/// The tag on which a liar behaves.
pub const TRUTH: EventTypeTag = EventTypeTag::new(100);
/// The tag on which a liar returns values the host cannot lift.
pub const LIE: EventTypeTag = EventTypeTag::new(101);
/// The tag on which a liar traps on every call.
pub const TRAP: EventTypeTag = EventTypeTag::new(102);

/// What a liar's `describe` returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Describe {
    /// `Truth`, `Lie` and `Trap` (tags 100, 101, 102), max batch 16 each:
    /// a well-formed description.
    Honest,
    /// Tag 100 twice, as `Truth` and as `Lie`.
    DuplicateTag,
    /// `Truth` with max batch 0.
    ZeroMaxBatch,
    /// A list whose pointer lies outside the module's memory.
    OutOfBounds,
}

/// Where `describe`'s list header (pointer, length) lies in memory.
const DESCRIBE_LIST: u32 = 0x80;
/// Where the event-type records lie.
const EVENT_TYPES: u32 = 0x100;
/// Where the names lie.
const NAMES: u32 = 0x200;
/// A pointer far past the single page of memory the module has.
const FAR_AWAY: u32 = 0xffff_0000;

/// The bytes of a liar component whose `describe` answers as `describe`.
pub fn liar(describe: Describe) -> Vec<u8> {
    wat::parse_str(liar_text(describe)).expect("the liar's component text is valid")
}

/// One event-type record as the canonical ABI lays it out (20 bytes).
fn event_type_record(tag: u32, name_at: u32, name_len: u32, max_batch: u32) -> Vec<u8> {
    let algebra_non_associative = 0u32;
    [tag, name_at, name_len, algebra_non_associative, max_batch].iter().flat_map(|word| word.to_le_bytes()).collect()
}

/// Bytes as a WAT data string.
fn wat_bytes(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("\\{byte:02x}")).collect()
}

fn liar_text(describe: Describe) -> String {
    // Names: "Truth" at NAMES, "Lie" at NAMES + 5, "Trap" at NAMES + 8.
    let (truth, lie, trap) = ((NAMES, 5), (NAMES + 5, 3), (NAMES + 8, 4));
    let (records, list_at, count): (Vec<Vec<u8>>, u32, u32) = match describe {
        Describe::Honest => (
            vec![
                event_type_record(TRUTH.get(), truth.0, truth.1, 16),
                event_type_record(LIE.get(), lie.0, lie.1, 16),
                event_type_record(TRAP.get(), trap.0, trap.1, 16),
            ],
            EVENT_TYPES,
            3,
        ),
        Describe::DuplicateTag => (
            vec![
                event_type_record(TRUTH.get(), truth.0, truth.1, 16),
                event_type_record(TRUTH.get(), lie.0, lie.1, 16),
            ],
            EVENT_TYPES,
            2,
        ),
        Describe::ZeroMaxBatch => (vec![event_type_record(TRUTH.get(), truth.0, truth.1, 0)], EVENT_TYPES, 1),
        Describe::OutOfBounds => (Vec::new(), FAR_AWAY, 3),
    };
    let records = wat_bytes(&records.concat());
    let list = wat_bytes(&[list_at.to_le_bytes(), count.to_le_bytes()].concat());
    let (lie_tag, trap_tag) = (LIE.get(), TRAP.get());
    format!(
        r#"(component
  (core module $liar
    (memory (export "memory") 1)
    (global $heap (mut i32) (i32.const 4096))
    ;; A bump allocator for the arguments the host lowers into memory; it is
    ;; reset by every export call, since no export keeps its arguments.
    (func (export "realloc") (param $old i32) (param $old_size i32) (param $align i32) (param $size i32) (result i32)
      (local $at i32) (local $end i32)
      (local.set $at (i32.and (i32.add (global.get $heap) (i32.const 7)) (i32.const -8)))
      (local.set $end (i32.add (local.get $at) (local.get $size)))
      (if (i32.gt_u (local.get $end) (i32.mul (memory.size) (i32.const 65536)))
        (then (drop (memory.grow (i32.add (i32.div_u (local.get $size) (i32.const 65536)) (i32.const 1))))))
      (global.set $heap (local.get $end))
      (local.get $at))
    (func $reset (global.set $heap (i32.const 4096)))
    (data (i32.const {NAMES}) "TruthLieTrap")
    (data (i32.const {EVENT_TYPES}) "{records}")
    (data (i32.const {DESCRIBE_LIST}) "{list}")
    ;; Every result is written at 0x40 (8-aligned, 16 bytes).
    (func (export "describe") (result i32) (i32.const {DESCRIBE_LIST}))
    (func (export "key") (param $tag i32) (param i32 i32) (result i32)
      (call $reset)
      (if (i32.eq (local.get $tag) (i32.const {trap_tag})) (then unreachable))
      (if (i32.eq (local.get $tag) (i32.const {lie_tag}))
        (then (i32.store8 (i32.const 0x40) (i32.const 7)) (return (i32.const 0x40))))
      (i32.store8 (i32.const 0x40) (i32.const 0))
      (i64.store (i32.const 0x48) (i64.const 42))
      (i32.const 0x40))
    (func (export "ordering") (param $tag i32) (param i32 i32) (result i32)
      (call $reset)
      (if (i32.eq (local.get $tag) (i32.const {trap_tag})) (then unreachable))
      (i32.store8 (i32.const 0x40) (i32.const 0))
      (i32.store8 (i32.const 0x44) (select (i32.const 9) (i32.const 0) (i32.eq (local.get $tag) (i32.const {lie_tag}))))
      (i32.const 0x40))
    (func (export "combine") (param $tag i32) (param i32 i32) (result i32)
      (call $reset)
      (if (i32.eq (local.get $tag) (i32.const {trap_tag})) (then unreachable))
      (i32.store8 (i32.const 0x40) (i32.const 0))
      (i32.store (i32.const 0x44) (select (i32.const {FAR_AWAY}) (i32.const 0x300) (i32.eq (local.get $tag) (i32.const {lie_tag}))))
      (i32.store (i32.const 0x48) (select (i32.const 0x10000) (i32.const 0) (i32.eq (local.get $tag) (i32.const {lie_tag}))))
      (i32.const 0x40))
    (func (export "handle") (param $tag i32) (param i64 i32 i32) (result i32)
      (call $reset)
      (if (i32.eq (local.get $tag) (i32.const {trap_tag})) (then unreachable))
      (if (i32.eq (local.get $tag) (i32.const {lie_tag}))
        (then
          ;; err({{ class: unrecoverable, message: <64 bytes far away> }})
          (i32.store8 (i32.const 0x40) (i32.const 1))
          (i32.store8 (i32.const 0x44) (i32.const 2))
          (i32.store (i32.const 0x48) (i32.const {FAR_AWAY}))
          (i32.store (i32.const 0x4c) (i32.const 64))
          (return (i32.const 0x40))))
      (i32.store8 (i32.const 0x40) (i32.const 0))
      (i32.const 0x40))
  )
  (core instance $core (instantiate $liar))
  (alias core export $core "memory" (core memory $memory))
  (alias core export $core "realloc" (core func $realloc))
  (type $algebra (enum "non-associative" "commutative" "idempotent" "idempotent-commutative" "associative"))
  (type $ordering (enum "relaxed" "acquire" "release" "acq-rel"))
  (type $error-class (enum "transient" "retryable" "unrecoverable"))
  (type $event-type (record (field "tag" u32) (field "name" string) (field "algebra" $algebra) (field "max-batch" u32)))
  (type $handler-error (record (field "class" $error-class) (field "message" string)))
  (func $describe (result (list $event-type))
    (canon lift (core func $core "describe") (memory $memory) (realloc $realloc)))
  (func $key (param "tag" u32) (param "body" (list u8)) (result (result u64 (error $handler-error)))
    (canon lift (core func $core "key") (memory $memory) (realloc $realloc)))
  (func $ordering (param "tag" u32) (param "body" (list u8)) (result (result $ordering (error $handler-error)))
    (canon lift (core func $core "ordering") (memory $memory) (realloc $realloc)))
  (func $combine (param "tag" u32) (param "bodies" (list (list u8))) (result (result (list u8) (error $handler-error)))
    (canon lift (core func $core "combine") (memory $memory) (realloc $realloc)))
  (func $handle (param "tag" u32) (param "key-hash" u64) (param "bodies" (list (list u8))) (result (result (error $handler-error)))
    (canon lift (core func $core "handle") (memory $memory) (realloc $realloc)))
  (instance $handler
    (export "algebra" (type $algebra))
    (export "message-ordering" (type $ordering))
    (export "error-class" (type $error-class))
    (export "event-type" (type $event-type))
    (export "handler-error" (type $handler-error))
    (export "describe" (func $describe))
    (export "key" (func $key))
    (export "ordering" (func $ordering))
    (export "combine" (func $combine))
    (export "handle" (func $handle)))
  (export "wakuwaku:handler/handler@0.1.0" (instance $handler))
)"#
    )
}

/// A component of another world: it exports `acme:greeter/greet@1.0.0`
/// (one function, `hello: func() -> u32`) and nothing of the contract.
pub fn other_world() -> Vec<u8> {
    wat::parse_str(
        r#"(component
            (core module $greeter (func (export "hello") (result i32) (i32.const 7)))
            (core instance $core (instantiate $greeter))
            (func $hello (result u32) (canon lift (core func $core "hello")))
            (instance $greet (export "hello" (func $hello)))
            (export "acme:greeter/greet@1.0.0" (instance $greet))
        )"#,
    )
    .expect("the other world's component text is valid")
}

/// A component that exports the contract's interface name, but whose
/// `describe` returns a `u32` and which has none of the other functions.
pub fn wrong_shape() -> Vec<u8> {
    wat::parse_str(
        r#"(component
            (core module $impostor (func (export "describe") (result i32) (i32.const 3)))
            (core instance $core (instantiate $impostor))
            (func $describe (result u32) (canon lift (core func $core "describe")))
            (instance $handler (export "describe" (func $describe)))
            (export "wakuwaku:handler/handler@0.1.0" (instance $handler))
        )"#,
    )
    .expect("the impostor's component text is valid")
}
