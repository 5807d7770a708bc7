//! What a module is granted: one table of capabilities that both links them
//! into the sandbox's linker and decides, when a component is loaded, which
//! imports it may have.
//!
//! Each entry names the imports it serves (one interface of the contract,
//! at the contract's version, or the WASI 0.2 interfaces the WASI linker
//! defines) and how it is linked (the interface's generated
//! `add_to_linker`). A component whose imports are not all served by some
//! entry is refused, with every import that is not listed: another
//! package, a WASI interface the host does not link (`wasi:http/…`,
//! `wasi:clocks/timezone`, …) or a WASI version it does not link
//! (`…@0.3.0`, an unversioned name, a pre-release).
//!
//! The contract's interfaces are served at four versions: the current one
//! ([`super::CONTRACT`], read from `wit/handler-0.5.wit`) and the previous
//! ones ([`super::CONTRACT_0_4`], `wit/handler-0.4.wit`, served through
//! `contract_0_4`; [`super::CONTRACT_0_3`], `wit/handler-0.3.wit`, served
//! through `contract_0_3`; [`super::CONTRACT_0_2`], `wit/handler.wit`,
//! served through `contract_0_2`), so no version is written here. An
//! interface new in the current version (`timers`) is served at it alone. A component's version is
//! the one of its contract imports and export ([`check_imports`] returns
//! it, and the sandbox binds the component with that version's bindings);
//! one that uses the contract at another version, or at both in one
//! component, is refused naming them. The WASI list is
//! written out by hand from wasmtime-wasi's `add_to_linker_sync` (wasmtime
//! has no way to ask a linker what it defines): after an upgrade, the real
//! Rust and Python guests the tests load are what show it still fits.

use wasmtime::Engine;
use wasmtime::component::{Component, HasSelf, Linker};

use super::bindings::wakuwaku::handler::types;
use super::{
    CONTRACT, CONTRACT_0_2, CONTRACT_0_3, CONTRACT_0_4, LoadError, StoreData, contract_0_2, contract_0_3, contract_0_4,
    emit, log, state, timers, wasi,
};

/// One capability the sandbox grants.
struct Capability {
    /// The imports it serves.
    serves: Imports,
    /// Adds it to a linker.
    link: fn(&mut Linker<StoreData>) -> wasmtime::Result<()>,
}

/// Which imports a capability serves.
enum Imports {
    /// One interface of the contract, at any version the host serves.
    Contract(&'static str),
    /// One interface new in the current version of the contract, served at
    /// that version alone.
    NewContract(&'static str),
    /// WASI 0.2: these interfaces (`wasi:cli/environment`), at any
    /// `0.2.<patch>` version (the linker resolves every 0.2 patch version
    /// to the one it links).
    Wasi(&'static [&'static str]),
}

/// The WASI 0.2 interfaces [`wasi::link`] links (wasmtime-wasi's
/// `add_to_linker_sync`: the command world without `run` and the unstable
/// `timezone`). Sockets are linked so that components built with a socket-
/// capable libc (CPython) load, but the context denies every socket.
const WASI_INTERFACES: [&str; 27] = [
    "cli/environment",
    "cli/exit",
    "cli/stdin",
    "cli/stdout",
    "cli/stderr",
    "cli/terminal-input",
    "cli/terminal-output",
    "cli/terminal-stdin",
    "cli/terminal-stdout",
    "cli/terminal-stderr",
    "clocks/monotonic-clock",
    "clocks/wall-clock",
    "filesystem/types",
    "filesystem/preopens",
    "io/error",
    "io/poll",
    "io/streams",
    "random/random",
    "random/insecure",
    "random/insecure-seed",
    "sockets/network",
    "sockets/instance-network",
    "sockets/udp",
    "sockets/udp-create-socket",
    "sockets/tcp",
    "sockets/tcp-create-socket",
    "sockets/ip-name-lookup",
];

/// Everything a module is granted. The contract's `types` interface holds
/// only types, but a component that uses them imports it, so it is linked.
const CAPABILITIES: [Capability; 6] = [
    Capability { serves: Imports::Contract("types"), link: link_types },
    Capability { serves: Imports::Contract("state"), link: state::link },
    Capability { serves: Imports::Contract("emit"), link: emit::link },
    Capability { serves: Imports::Contract("log"), link: log::link },
    Capability { serves: Imports::NewContract("timers"), link: timers::link },
    Capability { serves: Imports::Wasi(&WASI_INTERFACES), link: wasi::link },
];

fn link_types(linker: &mut Linker<StoreData>) -> wasmtime::Result<()> {
    types::add_to_linker::<StoreData, HasSelf<StoreData>>(linker, |data| data)
}

impl types::Host for StoreData {}

/// The contract's package without its version (`wakuwaku:handler`) and the
/// version (`0.3.0`).
fn contract_parts() -> (&'static str, &'static str) {
    CONTRACT.split_once('@').expect("the contract's package has a version")
}

/// The previous versions the host serves (`0.4.0`, `0.3.0`, `0.2.0`).
fn previous_versions() -> [&'static str; 3] {
    let version = |contract: &'static str| contract.split_once('@').expect("the contract's package has a version").1;
    [version(CONTRACT_0_4), version(CONTRACT_0_3), version(CONTRACT_0_2)]
}

/// The version of the contract a component was built for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Contract {
    /// [`CONTRACT`].
    Current,
    /// [`CONTRACT_0_4`], without timers.
    V0_4,
    /// [`CONTRACT_0_3`], without `timed-relaxed`.
    V0_3,
    /// [`CONTRACT_0_2`], without event time.
    V0_2,
}

impl Contract {
    fn of_version(version: &str) -> Option<Self> {
        let [v0_4, v0_3, v0_2] = previous_versions();
        if version == contract_parts().1 {
            Some(Self::Current)
        } else if version == v0_4 {
            Some(Self::V0_4)
        } else if version == v0_3 {
            Some(Self::V0_3)
        } else if version == v0_2 {
            Some(Self::V0_2)
        } else {
            None
        }
    }
}

/// The full name of the contract's interface `name` at its version, e.g.
/// `wakuwaku:handler/state@0.2.0`.
pub fn interface(name: &str) -> String {
    let (package, version) = contract_parts();
    format!("{package}/{name}@{version}")
}

impl Imports {
    fn serves(&self, import: &str) -> bool {
        match self {
            Self::Contract(name) => {
                let previous = |version| format!("{}/{name}@{version}", contract_parts().0);
                import == interface(name) || previous_versions().into_iter().any(|version| import == previous(version))
            }
            Self::NewContract(name) => import == interface(name),
            Self::Wasi(interfaces) => {
                let Some((interface, version)) = import.strip_prefix("wasi:").and_then(|name| name.split_once('@'))
                else {
                    return false;
                };
                let patch = version.strip_prefix("0.2.").unwrap_or_default();
                interfaces.contains(&interface) && !patch.is_empty() && patch.bytes().all(|b| b.is_ascii_digit())
            }
        }
    }

    fn describe(&self) -> String {
        match self {
            Self::Contract(name) => {
                let [v0_4, v0_3, v0_2] = previous_versions();
                format!("{} (or @{v0_4}, @{v0_3}, @{v0_2})", interface(name))
            }
            Self::NewContract(name) => interface(name),
            Self::Wasi(_) => {
                "wasi:*@0.2.x of the command world, without `run` and `timezone` (with an empty context)".to_owned()
            }
        }
    }
}

/// Links every capability, the contract's at every version served.
pub(super) fn link(linker: &mut Linker<StoreData>) -> wasmtime::Result<()> {
    CAPABILITIES.iter().try_for_each(|capability| (capability.link)(linker))?;
    contract_0_4::link(linker)?;
    contract_0_3::link(linker)?;
    contract_0_2::link(linker)
}

/// What the sandbox grants, for error messages.
pub fn granted() -> String {
    CAPABILITIES.iter().map(|capability| capability.serves.describe()).collect::<Vec<_>>().join(", ")
}

/// Whether some capability serves `import`.
pub fn is_granted(import: &str) -> bool {
    CAPABILITIES.iter().any(|capability| capability.serves.serves(import))
}

/// The version of the contract a component was built for (the current one
/// when it names none); refuses a component that uses the contract at a
/// version the host does not serve, or at two versions, or that imports
/// anything no capability serves.
pub(super) fn check_imports(engine: &Engine, module: &str, component: &Component) -> Result<Contract, LoadError> {
    let component_type = component.component_type();
    let imports: Vec<String> = component_type.imports(engine).map(|(name, _)| name.to_owned()).collect();
    let exports = component_type.exports(engine).map(|(name, _)| name.to_owned());
    let package = contract_parts().0;
    let mut versions: Vec<String> = imports
        .iter()
        .cloned()
        .chain(exports)
        .filter_map(|name| Some(name.strip_prefix(package)?.strip_prefix('/')?.split_once('@')?.1.to_owned()))
        .collect();
    versions.sort();
    versions.dedup();
    let contract = match &versions[..] {
        [] => Contract::Current,
        [version] => Contract::of_version(version).ok_or_else(|| LoadError::ContractVersion {
            module: module.to_owned(),
            found: format!("{package}@{version}"),
        })?,
        several => {
            let found = several.iter().map(|v| format!("{package}@{v}")).collect::<Vec<_>>().join(" and ");
            return Err(LoadError::ContractVersion { module: module.to_owned(), found: format!("{found} at once") });
        }
    };
    let forbidden: Vec<String> = imports.into_iter().filter(|import| !is_granted(import)).collect();
    if forbidden.is_empty() {
        Ok(contract)
    } else {
        Err(LoadError::ForbiddenImports { module: module.to_owned(), imports: forbidden })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The interfaces the WIT world `module` imports, read from the file
    /// the bindings are generated from.
    fn world_imports() -> Vec<String> {
        let wit = include_str!("../../../../wit/handler-0.5.wit");
        let world = &wit[wit.find("world module").expect("the world")..];
        world
            .lines()
            .filter_map(|line| line.trim().strip_prefix("import ")?.strip_suffix(';').map(str::to_owned))
            .collect()
    }

    #[test]
    fn every_import_of_the_world_is_granted_and_nothing_else_of_the_contract() {
        let imports = world_imports();
        assert_eq!(imports, ["state", "emit", "log", "timers"]);
        for name in imports.iter().map(String::as_str).chain(["types"]) {
            assert!(is_granted(&interface(name)), "{name}");
        }
        assert!(!is_granted(&interface("handler")), "the export is not an import");
        assert!(!is_granted("wakuwaku:handler/state@0.1.0"));
        assert!(is_granted("wakuwaku:handler/state@0.2.0"), "the previous contracts' imports are served");
        assert!(is_granted("wakuwaku:handler/emit@0.3.0"), "the previous contracts' imports are served");
        assert!(is_granted("wakuwaku:handler/log@0.4.0"), "the previous contracts' imports are served");
        assert!(is_granted("wakuwaku:handler/timers@0.5.0"));
        assert!(!is_granted("wakuwaku:handler/timers@0.4.0"), "0.4 had no timers");
        assert!(!is_granted("wakuwaku:handler/handler@0.3.0"), "the export is not an import");
        assert!(!is_granted("wakuwaku:handler/handler@0.2.0"), "the export is not an import");
        assert_eq!(Contract::of_version("0.2.0"), Some(Contract::V0_2));
        assert_eq!(Contract::of_version("0.3.0"), Some(Contract::V0_3));
        assert_eq!(Contract::of_version("0.4.0"), Some(Contract::V0_4));
        assert_eq!(Contract::of_version("0.5.0"), Some(Contract::Current));
        assert_eq!(Contract::of_version("0.6.0"), None);
        assert!(!is_granted("evil:net/socket"));
        assert!(is_granted("wasi:cli/environment@0.2.0"));
    }

    #[test]
    fn wasi_is_granted_by_interface_and_version() {
        for interface in WASI_INTERFACES {
            for version in ["0.2.0", "0.2.3", "0.2.12", "0.2.99"] {
                assert!(is_granted(&format!("wasi:{interface}@{version}")), "{interface}@{version}");
            }
        }
        let refused = [
            "wasi:http/outgoing-handler@0.2.0",
            "wasi:http/types@0.2.12",
            "wasi:clocks/timezone@0.2.12",
            "wasi:cli/run@0.2.0",
            "wasi:keyvalue/store@0.2.0-draft",
            "wasi:cli/environment",
            "wasi:cli/environment@0.3.0",
            "wasi:cli/environment@0.1.0",
            "wasi:cli/environment@1.0.0",
            "wasi:cli/environment@0.2.",
            "wasi:cli/environment@0.2.0-rc-2023-11-10",
            "wasi:cli/environment@0.2.0+build",
            "wasi:sockets/tcp@0.3.0-rc-2025-09-16",
            "wasi:cli/environment/extra@0.2.0",
            "wasix:cli/environment@0.2.0",
        ];
        for name in refused {
            assert!(!is_granted(name), "{name}");
        }
    }

    #[test]
    fn the_grant_list_names_the_contract_version() {
        let granted = granted();
        assert!(granted.contains(&format!("wakuwaku:handler/state@{}", contract_parts().1)), "{granted}");
        assert!(granted.contains("wasi:*"), "{granted}");
    }
}
