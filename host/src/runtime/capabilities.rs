//! What a module is granted: one table of capabilities that both links them
//! into the sandbox's linker and decides, when a component is loaded, which
//! imports it may have.
//!
//! Each entry names the imports it serves (one interface of the contract,
//! at the contract's version, or the WASI package) and how it is linked
//! (the interface's generated `add_to_linker`). A component whose imports
//! are not all served by some entry is refused, with every import that is
//! not listed; one that imports or exports the contract at another version
//! is refused naming both versions. The contract's version is read from
//! `wit/handler.wit` ([`super::CONTRACT`]), so no version is written here.

use wasmtime::Engine;
use wasmtime::component::{Component, HasSelf, Linker};

use super::bindings::wakuwaku::handler::types;
use super::{CONTRACT, LoadError, StoreData, emit, log, state, wasi};

/// One capability the sandbox grants.
struct Capability {
    /// The imports it serves.
    serves: Imports,
    /// Adds it to a linker.
    link: fn(&mut Linker<StoreData>) -> wasmtime::Result<()>,
}

/// Which imports a capability serves.
enum Imports {
    /// One interface of the contract, at the contract's version.
    Contract(&'static str),
    /// Every import whose name starts with this.
    Prefix(&'static str),
}

/// Everything a module is granted. The contract's `types` interface holds
/// only types, but a component that uses them imports it, so it is linked.
const CAPABILITIES: [Capability; 5] = [
    Capability { serves: Imports::Contract("types"), link: link_types },
    Capability { serves: Imports::Contract("state"), link: state::link },
    Capability { serves: Imports::Contract("emit"), link: emit::link },
    Capability { serves: Imports::Contract("log"), link: log::link },
    Capability { serves: Imports::Prefix("wasi:"), link: wasi::link },
];

fn link_types(linker: &mut Linker<StoreData>) -> wasmtime::Result<()> {
    types::add_to_linker::<StoreData, HasSelf<StoreData>>(linker, |data| data)
}

impl types::Host for StoreData {}

/// The contract's package without its version (`wakuwaku:handler`) and the
/// version (`0.2.0`).
fn contract_parts() -> (&'static str, &'static str) {
    CONTRACT.split_once('@').expect("the contract's package has a version")
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
            Self::Contract(name) => import == interface(name),
            Self::Prefix(prefix) => import.starts_with(prefix),
        }
    }

    fn describe(&self) -> String {
        match self {
            Self::Contract(name) => interface(name),
            Self::Prefix(prefix) => format!("{prefix}* (with an empty context)"),
        }
    }
}

/// Links every capability.
pub(super) fn link(linker: &mut Linker<StoreData>) -> wasmtime::Result<()> {
    CAPABILITIES.iter().try_for_each(|capability| (capability.link)(linker))
}

/// What the sandbox grants, for error messages.
pub fn granted() -> String {
    CAPABILITIES.iter().map(|capability| capability.serves.describe()).collect::<Vec<_>>().join(", ")
}

/// Whether some capability serves `import`.
pub fn is_granted(import: &str) -> bool {
    CAPABILITIES.iter().any(|capability| capability.serves.serves(import))
}

/// Refuses a component that uses the contract at another version, or that
/// imports anything no capability serves.
pub(super) fn check_imports(engine: &Engine, module: &str, component: &Component) -> Result<(), LoadError> {
    let component_type = component.component_type();
    let imports: Vec<String> = component_type.imports(engine).map(|(name, _)| name.to_owned()).collect();
    let exports = component_type.exports(engine).map(|(name, _)| name.to_owned());
    let (package, version) = contract_parts();
    let other_version = imports.iter().cloned().chain(exports).find_map(|name| {
        let found = name.strip_prefix(package)?.strip_prefix('/')?.split_once('@')?.1.to_owned();
        (found != version).then(|| format!("{package}@{found}"))
    });
    if let Some(found) = other_version {
        return Err(LoadError::ContractVersion { module: module.to_owned(), found });
    }
    let forbidden: Vec<String> = imports.into_iter().filter(|import| !is_granted(import)).collect();
    if forbidden.is_empty() {
        Ok(())
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
        let wit = include_str!("../../../wit/handler.wit");
        let world = &wit[wit.find("world module").expect("the world")..];
        world
            .lines()
            .filter_map(|line| line.trim().strip_prefix("import ")?.strip_suffix(';').map(str::to_owned))
            .collect()
    }

    #[test]
    fn every_import_of_the_world_is_granted_and_nothing_else_of_the_contract() {
        let imports = world_imports();
        assert_eq!(imports, ["state", "emit", "log"]);
        for name in imports.iter().map(String::as_str).chain(["types"]) {
            assert!(is_granted(&interface(name)), "{name}");
        }
        assert!(!is_granted(&interface("handler")), "the export is not an import");
        assert!(!is_granted("wakuwaku:handler/state@0.1.0"));
        assert!(!is_granted("evil:net/socket"));
        assert!(is_granted("wasi:cli/environment@0.2.0"));
    }

    #[test]
    fn the_grant_list_names_the_contract_version() {
        let granted = granted();
        assert!(granted.contains(&format!("wakuwaku:handler/state@{}", contract_parts().1)), "{granted}");
        assert!(granted.contains("wasi:*"), "{granted}");
    }
}
