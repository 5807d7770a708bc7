//! Hand-written components that break the contract in ways the SDK never
//! would: they describe themselves badly, or return values the host cannot
//! lift (out-of-bounds pointers, unknown enum cases, unknown variant
//! discriminants), or values it can lift but must refuse (a key that is not
//! canonical, an empty `combine` body, a huge error message), or trap on
//! every call.
//!
//! [`liar`] builds one from component text: a core module with a bump
//! allocator, lifted as the `handler` interface of the contract's previous
//! version ([`wakuwaku::sandbox::runtime::CONTRACT_0_2`], which the host still
//! loads: no `event-time` export, no `timing` in an event type, so the
//! records below keep their layout). It imports nothing, so it loads into
//! any sandbox. What `describe` returns is chosen with
//! [`Describe`]; the other exports answer by tag:
//!
//! | tag | name | every export |
//! | --- | --- | --- |
//! | [`TRUTH`] (100) | `Truth` | behaves: `key` is the integer 42 (`01 54`), `ordering` relaxed, `combine` the body `{}`, `handle` ok |
//! | [`LIE`] (101) | `Lie` | returns garbage: `key` an unknown result discriminant, `ordering` enum case 9, `combine` a list far out of bounds, `handle` an error whose message is out of bounds |
//! | [`TRAP`] (102) | `Trap` | executes `unreachable` |
//! | [`BAD`] (103) | `Bad` | returns values that lift but break a rule: `key` the non-canonical `01 80 00`, `combine` an empty body, `handle` an unrecoverable error with a 16 KiB message |
//!
//! Any other tag behaves like [`TRUTH`]. The tags do not collide with the
//! probe module's, so a projection can hold both.
//!
//! [`other_world`] and [`wrong_shape`] are components that are not handlers
//! at all: one exports some other interface, the other exports the handler
//! interface's name with functions of the wrong types. [`old_contract`] is
//! a well-formed handler of a contract version the host no longer loads,
//! 0.1.0.

use wakuwaku::event::EventTypeTag;

/// The tag on which a liar behaves.
pub const TRUTH: EventTypeTag = EventTypeTag::new(100);
/// The tag on which a liar returns values the host cannot lift.
pub const LIE: EventTypeTag = EventTypeTag::new(101);
/// The tag on which a liar traps on every call.
pub const TRAP: EventTypeTag = EventTypeTag::new(102);
/// The tag on which a liar returns values the host must refuse.
pub const BAD: EventTypeTag = EventTypeTag::new(103);

/// The length of the error message `handle` returns for [`BAD`].
pub const BAD_MESSAGE_LEN: usize = 16 << 10;

/// What a liar's `describe` returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Describe {
    /// `Truth`, `Lie`, `Trap` and `Bad` (tags 100 to 103), max batch 16
    /// each, no emit topic: a well-formed description.
    Honest,
    /// Tag 100 twice, as `Truth` and as `Lie`.
    DuplicateTag,
    /// `Truth` with max batch 0.
    ZeroMaxBatch,
    /// A list whose pointer lies outside the module's memory.
    OutOfBounds,
    /// An event type named `no spaces`.
    BadName,
    /// No event type at all.
    NoEventTypes,
    /// 257 event types.
    TooManyEventTypes,
    /// `Truth`, emitting to the host's own `dlq_mixed`.
    HostTopic,
    /// `Truth`, emitting to `a/b`, which is no topic name.
    BadTopic,
    /// `Truth` and, as `Lie`, the tag the host reserves for the dead
    /// letters of timers (4294967295).
    ReservedTag,
}

/// Where each export writes its result (8-aligned, 16 bytes).
const RESULT: u32 = 0x40;
/// Where `describe`'s record (two list headers) lies.
const DESCRIBE: u32 = 0x80;
/// Where the event type names lie.
const NAMES: u32 = 0x200;
/// Where the emit topic names lie.
const TOPIC_NAMES: u32 = 0x280;
/// Where the emit topics' list of strings lies.
const TOPICS: u32 = 0x2c0;
/// Where the body `{}` of `combine` lies.
const COMBINED: u32 = 0x300;
/// Where the canonical key 42 lies.
const KEY_42: u32 = 0x380;
/// Where the non-canonical key lies.
const KEY_BAD: u32 = 0x388;
/// Where the event-type records lie.
const EVENT_TYPES: u32 = 0x1000;
/// Where the long error message is written.
const BIG_MESSAGE: u32 = 0x8000;
/// A pointer far past the single page of memory the module has.
const FAR_AWAY: u32 = 0xffff_0000;

/// The bytes of a liar component whose `describe` answers as `describe`.
pub fn liar(describe: Describe) -> Vec<u8> {
    wat::parse_str(liar_text(describe)).expect("the liar's component text is valid")
}

/// One event-type record as the canonical ABI lays it out (20 bytes).
fn event_type_record(tag: u32, name: (u32, u32), max_batch: u32) -> Vec<u8> {
    let algebra_non_associative = 0u32;
    [tag, name.0, name.1, algebra_non_associative, max_batch].iter().flat_map(|word| word.to_le_bytes()).collect()
}

/// Bytes as a WAT data string.
fn wat_bytes(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("\\{byte:02x}")).collect()
}

/// The package and version of the contract the liars are built for:
/// `wakuwaku:handler` and `0.2.0`.
fn contract() -> (&'static str, &'static str) {
    wakuwaku::sandbox::runtime::CONTRACT_0_2.split_once('@').expect("a versioned package")
}

// Long because it is one module's text, written out as the host reads it.
fn liar_text(describe: Describe) -> String {
    // Names: "Truth" at NAMES, "Lie" at +5, "Trap" at +8, "Bad" at +12,
    // "no spaces" at +15.
    let (truth, lie, trap, bad, spaced) =
        ((NAMES, 5), (NAMES + 5, 3), (NAMES + 8, 4), (NAMES + 12, 3), (NAMES + 15, 9));
    let honest = || {
        vec![
            event_type_record(100, truth, 16),
            event_type_record(101, lie, 16),
            event_type_record(102, trap, 16),
            event_type_record(103, bad, 16),
        ]
    };
    let one_truth = || vec![event_type_record(100, truth, 16)];
    let (records, types_at, topics): (Vec<Vec<u8>>, u32, &[&str]) = match describe {
        Describe::Honest => (honest(), EVENT_TYPES, &[]),
        Describe::DuplicateTag => {
            (vec![event_type_record(100, truth, 16), event_type_record(100, lie, 16)], EVENT_TYPES, &[])
        }
        Describe::ZeroMaxBatch => (vec![event_type_record(100, truth, 0)], EVENT_TYPES, &[]),
        Describe::OutOfBounds => (honest(), FAR_AWAY, &[]),
        Describe::BadName => (vec![event_type_record(100, spaced, 16)], EVENT_TYPES, &[]),
        Describe::NoEventTypes => (Vec::new(), EVENT_TYPES, &[]),
        Describe::TooManyEventTypes => {
            ((0..257).map(|tag| event_type_record(tag, truth, 16)).collect(), EVENT_TYPES, &[])
        }
        Describe::HostTopic => (one_truth(), EVENT_TYPES, &["dlq_mixed"]),
        Describe::BadTopic => (one_truth(), EVENT_TYPES, &["a/b"]),
        Describe::ReservedTag => {
            (vec![event_type_record(100, truth, 16), event_type_record(u32::MAX, lie, 16)], EVENT_TYPES, &[])
        }
    };
    let types_len = records.len() as u32;
    let records = wat_bytes(&records.concat());
    let mut topic_names = Vec::new();
    let mut topic_list = Vec::new();
    for topic in topics {
        topic_list.extend((TOPIC_NAMES + topic_names.len() as u32).to_le_bytes());
        topic_list.extend((topic.len() as u32).to_le_bytes());
        topic_names.extend(topic.as_bytes());
    }
    let describe_record = wat_bytes(
        &[types_at, types_len, TOPICS, topics.len() as u32].iter().flat_map(|w| w.to_le_bytes()).collect::<Vec<_>>(),
    );
    let (topic_names, topic_list) = (wat_bytes(&topic_names), wat_bytes(&topic_list));
    let (lie_tag, trap_tag, bad_tag) = (LIE.get(), TRAP.get(), BAD.get());
    let (package, version) = contract();
    format!(
        r#"(component
  (core module $liar
    (memory (export "memory") 1)
    (global $heap (mut i32) (i32.const 0xc000))
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
    (func $reset (global.set $heap (i32.const 0xc000)))
    (data (i32.const {NAMES}) "TruthLieTrapBadno spaces")
    (data (i32.const {TOPIC_NAMES}) "{topic_names}")
    (data (i32.const {TOPICS}) "{topic_list}")
    (data (i32.const {COMBINED}) "{{}}")
    (data (i32.const {KEY_42}) "\01\54")
    (data (i32.const {KEY_BAD}) "\01\80\00")
    (data (i32.const {EVENT_TYPES}) "{records}")
    (data (i32.const {DESCRIBE}) "{describe_record}")
    (func (export "describe") (result i32) (i32.const {DESCRIBE}))
    ;; ok(list) or the lie: an unknown discriminant.
    (func (export "key") (param $tag i32) (param i32 i32) (result i32)
      (call $reset)
      (if (i32.eq (local.get $tag) (i32.const {trap_tag})) (then unreachable))
      (if (i32.eq (local.get $tag) (i32.const {lie_tag}))
        (then (i32.store8 (i32.const {RESULT}) (i32.const 7)) (return (i32.const {RESULT}))))
      (i32.store8 (i32.const {RESULT}) (i32.const 0))
      (if (i32.eq (local.get $tag) (i32.const {bad_tag}))
        (then
          (i32.store (i32.const 0x44) (i32.const {KEY_BAD}))
          (i32.store (i32.const 0x48) (i32.const 3))
          (return (i32.const {RESULT}))))
      (i32.store (i32.const 0x44) (i32.const {KEY_42}))
      (i32.store (i32.const 0x48) (i32.const 2))
      (i32.const {RESULT}))
    (func (export "ordering") (param $tag i32) (param i32 i32) (result i32)
      (call $reset)
      (if (i32.eq (local.get $tag) (i32.const {trap_tag})) (then unreachable))
      (i32.store8 (i32.const {RESULT}) (i32.const 0))
      (i32.store8 (i32.const 0x44) (select (i32.const 9) (i32.const 0) (i32.eq (local.get $tag) (i32.const {lie_tag}))))
      (i32.const {RESULT}))
    (func (export "combine") (param $tag i32) (param i32 i32) (result i32)
      (call $reset)
      (if (i32.eq (local.get $tag) (i32.const {trap_tag})) (then unreachable))
      (i32.store8 (i32.const {RESULT}) (i32.const 0))
      (i32.store (i32.const 0x44) (select (i32.const {FAR_AWAY}) (i32.const {COMBINED}) (i32.eq (local.get $tag) (i32.const {lie_tag}))))
      (i32.store (i32.const 0x48)
        (if (result i32) (i32.eq (local.get $tag) (i32.const {lie_tag}))
          (then (i32.const 0x10000))
          (else (select (i32.const 0) (i32.const 2) (i32.eq (local.get $tag) (i32.const {bad_tag}))))))
      (i32.const {RESULT}))
    (func (export "handle") (param $tag i32) (param i32 i32 i32 i32) (result i32)
      (call $reset)
      (if (i32.eq (local.get $tag) (i32.const {trap_tag})) (then unreachable))
      (if (i32.eq (local.get $tag) (i32.const {lie_tag}))
        (then
          ;; err({{ class: unrecoverable, message: <64 bytes far away> }})
          (i32.store8 (i32.const {RESULT}) (i32.const 1))
          (i32.store8 (i32.const 0x44) (i32.const 2))
          (i32.store (i32.const 0x48) (i32.const {FAR_AWAY}))
          (i32.store (i32.const 0x4c) (i32.const 64))
          (return (i32.const {RESULT}))))
      (if (i32.eq (local.get $tag) (i32.const {bad_tag}))
        (then
          ;; err({{ class: unrecoverable, message: "mmm…" ({BAD_MESSAGE_LEN} bytes) }})
          (memory.fill (i32.const {BIG_MESSAGE}) (i32.const 109) (i32.const {BAD_MESSAGE_LEN}))
          (i32.store8 (i32.const {RESULT}) (i32.const 1))
          (i32.store8 (i32.const 0x44) (i32.const 2))
          (i32.store (i32.const 0x48) (i32.const {BIG_MESSAGE}))
          (i32.store (i32.const 0x4c) (i32.const {BAD_MESSAGE_LEN}))
          (return (i32.const {RESULT}))))
      (i32.store8 (i32.const {RESULT}) (i32.const 0))
      (i32.const {RESULT}))
  )
  (core instance $core (instantiate $liar))
  (alias core export $core "memory" (core memory $memory))
  (alias core export $core "realloc" (core func $realloc))
  (type $algebra (enum "non-associative" "commutative" "idempotent" "idempotent-commutative" "associative"))
  (type $ordering (enum "relaxed" "acquire" "release" "acq-rel"))
  (type $error-class (enum "transient" "retryable" "unrecoverable"))
  (type $event-type (record (field "tag" u32) (field "name" string) (field "algebra" $algebra) (field "max-batch" u32)))
  (type $module-info (record (field "event-types" (list $event-type)) (field "emits" (list string))))
  (type $handler-error (record (field "class" $error-class) (field "message" string)))
  (func $describe (result $module-info)
    (canon lift (core func $core "describe") (memory $memory) (realloc $realloc)))
  (func $key (param "tag" u32) (param "body" (list u8)) (result (result (list u8) (error $handler-error)))
    (canon lift (core func $core "key") (memory $memory) (realloc $realloc)))
  (func $ordering (param "tag" u32) (param "body" (list u8)) (result (result $ordering (error $handler-error)))
    (canon lift (core func $core "ordering") (memory $memory) (realloc $realloc)))
  (func $combine (param "tag" u32) (param "bodies" (list (list u8))) (result (result (list u8) (error $handler-error)))
    (canon lift (core func $core "combine") (memory $memory) (realloc $realloc)))
  (func $handle (param "tag" u32) (param "key" (list u8)) (param "bodies" (list (list u8))) (result (result (error $handler-error)))
    (canon lift (core func $core "handle") (memory $memory) (realloc $realloc)))
  (instance $handler
    (export "algebra" (type $algebra))
    (export "event-type" (type $event-type))
    (export "module-info" (type $module-info))
    (export "message-ordering" (type $ordering))
    (export "error-class" (type $error-class))
    (export "handler-error" (type $handler-error))
    (export "describe" (func $describe))
    (export "key" (func $key))
    (export "ordering" (func $ordering))
    (export "combine" (func $combine))
    (export "handle" (func $handle)))
  (export "{package}/handler@{version}" (instance $handler))
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
    let (package, version) = contract();
    wat::parse_str(format!(
        r#"(component
            (core module $impostor (func (export "describe") (result i32) (i32.const 3)))
            (core instance $core (instantiate $impostor))
            (func $describe (result u32) (canon lift (core func $core "describe")))
            (instance $handler (export "describe" (func $describe)))
            (export "{package}/handler@{version}" (instance $handler))
        )"#
    ))
    .expect("the impostor's component text is valid")
}

/// A handler of the previous contract, `wakuwaku:handler@0.1.0`: it
/// imports that version's `log` and exports its `handler` (reduced to
/// `describe`), as a module built with an older SDK would.
pub fn old_contract() -> Vec<u8> {
    wat::parse_str(
        r#"(component
            (import "wakuwaku:handler/log@0.1.0" (instance))
            (core module $old (func (export "describe") (result i32) (i32.const 3)))
            (core instance $core (instantiate $old))
            (func $describe (result u32) (canon lift (core func $core "describe")))
            (instance $handler (export "describe" (func $describe)))
            (export "wakuwaku:handler/handler@0.1.0" (instance $handler))
        )"#,
    )
    .expect("the old contract's component text is valid")
}

/// A component that uses the contract at two versions: it imports the 0.2
/// `log` and exports the current version's `handler` (reduced to
/// `describe`). No SDK builds such a thing; the host refuses it.
pub fn mixed_contract() -> Vec<u8> {
    let (package, previous) = contract();
    let current = wakuwaku::sandbox::runtime::CONTRACT.split_once('@').expect("a versioned package").1;
    wat::parse_str(format!(
        r#"(component
            (import "{package}/log@{previous}" (instance))
            (core module $mixed (func (export "describe") (result i32) (i32.const 3)))
            (core instance $core (instantiate $mixed))
            (func $describe (result u32) (canon lift (core func $core "describe")))
            (instance $handler (export "describe" (func $describe)))
            (export "{package}/handler@{current}" (instance $handler))
        )"#
    ))
    .expect("the mixed component's text is valid")
}
