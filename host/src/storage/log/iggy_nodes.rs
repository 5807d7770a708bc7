//! The servers an Iggy log is given: one, or the nodes of a replicated
//! cluster, named in one URL.
//!
//! Rules kept here:
//! - **One URL names every node.** `iggy://user:password@host:port` is one
//!   server; `iggy://user:password@a:8090,b:8090,c:8090?options` is a
//!   cluster, every node reached with the same credentials and options. So
//!   `--iggy`, `WAKU_IGGY` and `iggy = "…"` in `waku.toml` take a cluster as
//!   they take a server, and a password never has to be written twice.
//! - **A bad list is refused naming the problem**: an empty address
//!   (`a:1,,b:2`), an address without a port, and the same address twice
//!   ([`NodesError`]); nothing is dialled before the list is whole.
//! - **A cluster never waits on a dead node.** The client crate redials its
//!   node on a lost connection (forever, by default), and first waits
//!   until `reestablish_after` (5 s) has passed since it connected; for a
//!   cluster the URL of each node gets `reconnection_retries=0` and
//!   `reestablish_after=0s` unless it sets the options itself, so a call
//!   on a dead node fails at once and the log dials the next node
//!   ([`Nodes::after`]). One server keeps the bounded
//!   redial of [`with_bounded_reconnection`]: there is nowhere else to go.
//! - **Failover goes round the roster**, starting after the node that
//!   failed, so every node is tried once before any is tried again.

/// A list of Iggy servers that cannot be used, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NodesError {
    /// An empty entry in the list of addresses.
    #[error("the Iggy URL names an empty address (entry {position} of `{addresses}`)")]
    EmptyAddress {
        /// Its place in the list, from 1.
        position: usize,
        /// The list as written.
        addresses: String,
    },
    /// An address without a port.
    #[error("the Iggy address `{address}` has no port (write host:port, e.g. 127.0.0.1:8090)")]
    NoPort {
        /// The address.
        address: String,
    },
    /// The same address twice.
    #[error("the Iggy address `{address}` is named twice")]
    Repeated {
        /// The address.
        address: String,
    },
}

/// The servers of one log, as one URL each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Nodes {
    /// One URL per node: the given URL with that node's address alone.
    urls: Vec<String>,
    /// Each node's address (`host:port`), for messages.
    addresses: Vec<String>,
}

impl Nodes {
    /// The nodes `url` names. A URL the list rules do not concern (no
    /// `://`, no address) is kept as one node, for the client crate to
    /// refuse with its own words.
    pub(crate) fn parse(url: &str) -> Result<Self, NodesError> {
        let Some((head, list, tail)) = split_addresses(url) else {
            return Ok(Self { urls: vec![with_bounded_reconnection(url)], addresses: vec![url.to_owned()] });
        };
        if !list.contains(',') {
            return Ok(Self { urls: vec![with_bounded_reconnection(url)], addresses: vec![list.to_owned()] });
        }
        let mut addresses: Vec<String> = Vec::new();
        for (index, address) in list.split(',').enumerate() {
            let address = address.trim();
            if address.is_empty() {
                return Err(NodesError::EmptyAddress { position: index + 1, addresses: list.to_owned() });
            }
            if address.rsplit_once(':').is_none_or(|(_, port)| port.is_empty()) {
                return Err(NodesError::NoPort { address: address.to_owned() });
            }
            if addresses.iter().any(|known| known == address) {
                return Err(NodesError::Repeated { address: address.to_owned() });
            }
            addresses.push(address.to_owned());
        }
        let urls = addresses.iter().map(|address| without_redial(&format!("{head}{address}{tail}"))).collect();
        Ok(Self { urls, addresses })
    }

    /// How many nodes.
    pub(crate) fn len(&self) -> usize {
        self.urls.len()
    }

    /// Whether these are the nodes of a cluster (more than one).
    pub(crate) fn is_cluster(&self) -> bool {
        self.urls.len() > 1
    }

    /// Node `index`'s URL.
    pub(crate) fn url(&self, index: usize) -> &str {
        &self.urls[index % self.urls.len()]
    }

    /// Node `index`'s address (`host:port`).
    pub(crate) fn address(&self, index: usize) -> &str {
        &self.addresses[index % self.addresses.len()]
    }

    /// Which node `address` (`host:port`) is, if the roster names it.
    pub(crate) fn position(&self, address: &str) -> Option<usize> {
        self.addresses.iter().position(|named| named == address)
    }

    /// Every node once, in the order a failover from node `failed` tries
    /// them: the ones after it round the roster, then `failed` itself (it
    /// may be back, or the only one).
    pub(crate) fn after(&self, failed: usize) -> impl Iterator<Item = usize> + '_ {
        let count = self.urls.len();
        (1..=count).map(move |step| (failed + step) % count)
    }
}

/// `url` cut around its address list: what comes before it (scheme and
/// credentials, up to the last `@`), the list, and what follows (the `?`
/// and the options). `None` when the URL has no scheme.
fn split_addresses(url: &str) -> Option<(&str, &str, &str)> {
    let scheme = url.find("://")? + 3;
    let query = url[scheme..].find('?').map_or(url.len(), |at| scheme + at);
    let start = url[scheme..query].rfind('@').map_or(scheme, |at| scheme + at + 1);
    Some((&url[..start], &url[start..query], &url[query..]))
}

/// `url` with `option` added unless the URL sets an option of that name.
fn with_default_option(url: &str, name: &str, option: &str) -> String {
    match url.split_once('?') {
        None => format!("{url}?{option}"),
        Some((_, query)) if query.split('&').any(|set| set.starts_with(name)) => url.to_owned(),
        Some(_) => format!("{url}&{option}"),
    }
}

/// `url`, with `reconnection_retries` bounded unless the URL sets it.
///
/// The client otherwise retries a lost connection forever inside whichever
/// call noticed it, so a server that is down would stall the host without a
/// word. Bounded, the call fails as [`super::LogError::Unavailable`] after
/// a few seconds; the consumer then reports the outage and keeps trying
/// with its own backoff, and start-up against an unreachable server ends
/// with an error instead of waiting silently.
pub(crate) fn with_bounded_reconnection(url: &str) -> String {
    with_default_option(url, "reconnection_retries=", "reconnection_retries=3")
}

/// A cluster node's `url`, whose client never redials it, nor waits to:
/// the log moves to the next node instead.
fn without_redial(url: &str) -> String {
    let url = with_default_option(url, "reconnection_retries=", "reconnection_retries=0");
    with_default_option(&url, "reestablish_after=", "reestablish_after=0s")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_address_is_one_server_with_a_bounded_redial() {
        let nodes = Nodes::parse("iggy://u:p@h:1").unwrap();
        assert!(!nodes.is_cluster());
        assert_eq!(nodes.url(0), "iggy://u:p@h:1?reconnection_retries=3");
        assert_eq!(nodes.address(0), "h:1");
    }

    #[test]
    fn several_addresses_are_a_cluster_sharing_credentials_and_options() {
        let nodes = Nodes::parse("iggy://u:p@a:1, b:2,c:3?nodelay=true").unwrap();
        assert!(nodes.is_cluster());
        assert_eq!(nodes.len(), 3);
        assert_eq!(nodes.url(1), "iggy://u:p@b:2?nodelay=true&reconnection_retries=0&reestablish_after=0s");
        let parsed = iggy::prelude::IggyClient::from_connection_string(nodes.url(1));
        assert!(parsed.is_ok(), "the client takes the options: {:?}", parsed.err());
        assert_eq!(nodes.address(2), "c:3");
        // A redial the URL asks for is kept.
        let kept = Nodes::parse("iggy://u:p@a:1,b:2?reconnection_retries=2&reestablish_after=1s").unwrap();
        assert_eq!(kept.url(0), "iggy://u:p@a:1?reconnection_retries=2&reestablish_after=1s");
    }

    #[test]
    fn a_password_holding_commas_and_ats_is_not_an_address() {
        let nodes = Nodes::parse("iggy://u:p,@x@a:1,b:2").unwrap();
        assert_eq!(nodes.url(0), "iggy://u:p,@x@a:1?reconnection_retries=0&reestablish_after=0s");
        assert_eq!(nodes.address(1), "b:2");
    }

    #[test]
    fn a_bad_list_is_refused_naming_the_problem() {
        assert_eq!(
            Nodes::parse("iggy://u:p@a:1,,b:2").unwrap_err(),
            NodesError::EmptyAddress { position: 2, addresses: "a:1,,b:2".into() }
        );
        assert_eq!(Nodes::parse("iggy://u:p@a:1,b").unwrap_err(), NodesError::NoPort { address: "b".into() });
        assert_eq!(Nodes::parse("iggy://u:p@a:1,a:1").unwrap_err(), NodesError::Repeated { address: "a:1".into() });
        assert!(Nodes::parse("iggy://u:p@a:1,b:2").is_ok());
    }

    #[test]
    fn failover_tries_every_node_once_starting_after_the_failed_one() {
        let nodes = Nodes::parse("iggy://u:p@a:1,b:2,c:3").unwrap();
        assert_eq!(nodes.after(0).collect::<Vec<_>>(), [1, 2, 0]);
        assert_eq!(nodes.after(2).collect::<Vec<_>>(), [0, 1, 2]);
        let one = Nodes::parse("iggy://u:p@a:1").unwrap();
        assert_eq!(one.after(0).collect::<Vec<_>>(), [0]);
        assert_eq!((nodes.position("b:2"), nodes.position("d:4")), (Some(1), None));
    }

    #[test]
    fn reconnection_is_bounded_unless_the_url_says_otherwise() {
        let url = "iggy://u:p@h:1";
        assert_eq!(with_bounded_reconnection(url), "iggy://u:p@h:1?reconnection_retries=3");
        assert_eq!(
            with_bounded_reconnection("iggy://u:p@h:1?nodelay=true"),
            format!("{url}?nodelay=true&reconnection_retries=3")
        );
        let unlimited = "iggy://u:p@h:1?nodelay=true&reconnection_retries=unlimited";
        assert_eq!(with_bounded_reconnection(unlimited), unlimited);
    }
}
