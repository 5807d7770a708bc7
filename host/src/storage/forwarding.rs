//! Forwarding a wide storage trait, written once: the methods a wrapper
//! does not define go to the value it wraps.
//!
//! [`EventLog`](crate::storage::log::EventLog) and
//! [`StateBackend`](crate::storage::state::StateBackend) have over twenty
//! methods each, and the types that wrap a log or a store (test doubles
//! with one fault, the rebuild's store handles) change one or two of them.
//! Each trait therefore has a forwarding trait
//! ([`ForwardingLog`](crate::storage::log::ForwardingLog),
//! [`ForwardingStore`](crate::storage::state::ForwardingStore)) whose
//! default methods call the wrapped value, and a blanket implementation of
//! the wide trait for every type that implements the forwarding one.
//!
//! Rules kept here:
//! - **One list per trait.** Each forwarding module lists the methods of its
//!   trait once, as a macro (`event_log_methods!`, `state_backend_methods!`)
//!   that hands them to [`forward_methods!`]; a new trait method is one line
//!   there, and every wrapper forwards it without a change.
//! - **A wrapper writes what it changes**, in its implementation of the
//!   forwarding trait, under the wide trait's method names: everything else
//!   is forwarded, the methods the wide trait gives a default included (a
//!   wrapper that wants the default over the wrapped value's answer says
//!   so).
//! - **An `async` method's future is `Send`**, as the wide trait asks: the
//!   value `inner()` hands out is held across the call.

/// Writes the forwarding of a trait's methods, from one list of their
/// signatures (without `&self`): `async fn name(arg: Type, …) -> Output;`
/// for a method that returns a future, `fn name(arg: Type, …) -> Output;`
/// for one that answers at once.
///
/// - `to_inner Trait; list`: the forwarding trait's default methods, each
///   calling the method of the same name on `self.inner()`.
/// - `to_forwarding Forwarding; list`: the wide trait's methods in its
///   blanket implementation, each calling `Forwarding`'s.
/// - `to_variants Enum [Variant, …]; list`: the wide trait's methods for an
///   enum whose variants each hold an implementation, each calling the
///   held value's.
macro_rules! forward_methods {
    (to_inner $trait:ident; $($list:tt)*) => {
        $crate::storage::forwarding::forward_methods!(@inner $trait; $($list)*);
    };
    (to_forwarding $forwarding:ident; $($list:tt)*) => {
        $crate::storage::forwarding::forward_methods!(@forwarding $forwarding; $($list)*);
    };
    (to_variants $enum:ident [$($variant:ident),+]; $($list:tt)*) => {
        $crate::storage::forwarding::forward_methods!(@variants $enum [$($variant),+]; $($list)*);
    };

    (@inner $trait:ident; async fn $name:ident($($arg:ident: $ty:ty),*) -> $out:ty; $($rest:tt)*) => {
        #[doc = concat!("[`", stringify!($trait), "::", stringify!($name), "`], forwarded to [`Self::inner`] unless defined.")]
        fn $name(&self, $($arg: $ty),*) -> impl std::future::Future<Output = $out> + Send {
            async move { $trait::$name(&*self.inner(), $($arg),*).await }
        }
        $crate::storage::forwarding::forward_methods!(@inner $trait; $($rest)*);
    };
    (@inner $trait:ident; fn $name:ident($($arg:ident: $ty:ty),*) $(-> $out:ty)?; $($rest:tt)*) => {
        #[doc = concat!("[`", stringify!($trait), "::", stringify!($name), "`], forwarded to [`Self::inner`] unless defined.")]
        fn $name(&self, $($arg: $ty),*) $(-> $out)? {
            $trait::$name(&*self.inner(), $($arg),*)
        }
        $crate::storage::forwarding::forward_methods!(@inner $trait; $($rest)*);
    };
    (@inner $trait:ident;) => {};

    (@forwarding $forwarding:ident; async fn $name:ident($($arg:ident: $ty:ty),*) -> $out:ty; $($rest:tt)*) => {
        fn $name(&self, $($arg: $ty),*) -> impl std::future::Future<Output = $out> + Send {
            <Self as $forwarding>::$name(self, $($arg),*)
        }
        $crate::storage::forwarding::forward_methods!(@forwarding $forwarding; $($rest)*);
    };
    (@forwarding $forwarding:ident; fn $name:ident($($arg:ident: $ty:ty),*) $(-> $out:ty)?; $($rest:tt)*) => {
        fn $name(&self, $($arg: $ty),*) $(-> $out)? {
            <Self as $forwarding>::$name(self, $($arg),*)
        }
        $crate::storage::forwarding::forward_methods!(@forwarding $forwarding; $($rest)*);
    };
    (@forwarding $forwarding:ident;) => {};

    (@variants $enum:ident $variants:tt; async fn $name:ident($($arg:ident: $ty:ty),*) -> $out:ty; $($rest:tt)*) => {
        fn $name(&self, $($arg: $ty),*) -> impl std::future::Future<Output = $out> + Send {
            async move {
                $crate::storage::forwarding::forward_methods!(@match self, $enum $variants, held => held.$name($($arg),*).await)
            }
        }
        $crate::storage::forwarding::forward_methods!(@variants $enum $variants; $($rest)*);
    };
    (@variants $enum:ident $variants:tt; fn $name:ident($($arg:ident: $ty:ty),*) $(-> $out:ty)?; $($rest:tt)*) => {
        fn $name(&self, $($arg: $ty),*) $(-> $out)? {
            $crate::storage::forwarding::forward_methods!(@match self, $enum $variants, held => held.$name($($arg),*))
        }
        $crate::storage::forwarding::forward_methods!(@variants $enum $variants; $($rest)*);
    };
    (@variants $enum:ident $variants:tt;) => {};

    (@match $self:ident, $enum:ident [$($variant:ident),+], $held:ident => $call:expr) => {
        match $self {
            $($enum::$variant($held) => $call,)+
        }
    };
}

pub(crate) use forward_methods;
