//! The `--coordinator` list, and where a redirect from a node that does not lead goes.
//!
//! An entry is `HOST:PORT`, or `ID=HOST:PORT` when the agent reaches coordinator node `ID`
//! through an address of its own: a proxy, a NAT or a relay between the regions. A node that
//! does not lead names the leader by the address the cluster's membership gives it (the one
//! the nodes reach each other at) and, since D35, by its raft id too. An agent that holds its
//! own address for that id goes there, so that it never goes around its proxy; with no entry
//! for the id (or no id in the answer, from an older node) it follows the named address, as
//! before.

use std::collections::BTreeMap;

use crate::settings::check_address;

/// One entry of the list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CoordinatorAddr {
    /// The raft id of the node this address reaches, when the entry names it.
    pub node_id: Option<u64>,
    /// `host:port` as this agent reaches it.
    pub address: String,
}

impl CoordinatorAddr {
    /// `HOST:PORT` or `ID=HOST:PORT`; the error says what is wrong with it.
    pub fn parse(entry: &str) -> Result<CoordinatorAddr, String> {
        let entry = entry.trim();
        let (node_id, address) = match entry.split_once('=') {
            Some((id, address)) => {
                let id = id
                    .trim()
                    .parse::<u64>()
                    .map_err(|_| format!("'{id}' is not a node id (expected ID=HOST:PORT)"))?;
                (Some(id), address.trim())
            }
            None => (None, entry),
        };
        check_address(address)?;
        Ok(CoordinatorAddr {
            node_id,
            address: address.to_owned(),
        })
    }
}

/// A leader as a node that does not lead names it: the address the membership gives, and
/// the node's raft id when the answer carries it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderHint {
    pub node_id: Option<u64>,
    pub address: String,
}

/// The parsed list: the addresses tried in turn, and this agent's own address per node id.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Coordinators {
    addresses: Vec<String>,
    by_node: BTreeMap<u64, String>,
}

impl Coordinators {
    /// Every entry parsed; every problem at once (one per entry, and an id given twice).
    pub fn parse<S: AsRef<str>>(entries: &[S]) -> Result<Coordinators, Vec<String>> {
        let mut list = Coordinators::default();
        let mut problems = Vec::new();
        for entry in entries.iter().map(AsRef::as_ref) {
            let parsed = match CoordinatorAddr::parse(entry) {
                Ok(p) => p,
                Err(p) => {
                    problems.push(format!("coordinator '{entry}': {p}"));
                    continue;
                }
            };
            if let Some(id) = parsed.node_id
                && list.by_node.insert(id, parsed.address.clone()).is_some()
            {
                problems.push(format!("coordinator node id {id} is given twice"));
            }
            list.addresses.push(parsed.address);
        }
        if problems.is_empty() {
            Ok(list)
        } else {
            Err(problems)
        }
    }

    /// The addresses, in the order given, to try in turn.
    pub fn addresses(&self) -> &[String] {
        &self.addresses
    }

    /// Where to reconnect when a node names `leader`: this agent's own address for its node
    /// when it has one, else the address named.
    pub fn redirect(&self, leader: &LeaderHint) -> String {
        leader
            .node_id
            .and_then(|id| self.by_node.get(&id))
            .unwrap_or(&leader.address)
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hint(node_id: Option<u64>, address: &str) -> LeaderHint {
        LeaderHint {
            node_id,
            address: address.to_owned(),
        }
    }

    #[test]
    fn entries_are_addresses_or_ids_with_addresses() {
        let list =
            Coordinators::parse(&["1=relay:7101", " 2 = relay:7102", "h3:7070"]).expect("parses");
        assert_eq!(list.addresses(), ["relay:7101", "relay:7102", "h3:7070"]);
        assert_eq!(
            CoordinatorAddr::parse("7=[::1]:7070"),
            Ok(CoordinatorAddr {
                node_id: Some(7),
                address: "[::1]:7070".to_owned()
            })
        );
    }

    #[test]
    fn bad_entries_are_all_named() {
        let problems =
            Coordinators::parse(&["x=h:1", "1=h", "2=h:1", "2=g:1", "h:port"]).expect_err("bad");
        assert_eq!(problems.len(), 4, "{problems:?}");
        assert!(problems[0].contains("'x' is not a node id"), "{problems:?}");
        assert!(
            problems[1].contains("'1=h': expected host:port"),
            "{problems:?}"
        );
        assert!(
            problems[2].contains("node id 2 is given twice"),
            "{problems:?}"
        );
        assert!(problems[3].contains("not a port number"), "{problems:?}");
    }

    #[test]
    fn a_redirect_to_a_node_the_agent_has_an_address_for_goes_there() {
        let list =
            Coordinators::parse(&["1=relay:7101", "2=relay:7102", "3=relay:7103"]).expect("parses");
        // The membership's address would go around the relay.
        assert_eq!(list.redirect(&hint(Some(2), "10.0.0.2:7070")), "relay:7102");
        assert_eq!(list.redirect(&hint(Some(3), "10.0.0.3:7070")), "relay:7103");
    }

    #[test]
    fn a_redirect_the_agent_has_no_address_for_goes_where_it_names() {
        let mapped = Coordinators::parse(&["1=relay:7101", "h2:7070"]).expect("parses");
        let plain = Coordinators::parse(&["h1:7070", "h2:7070"]).expect("parses");
        // A node the list has no id for, and an answer without an id (an older node).
        assert_eq!(mapped.redirect(&hint(Some(4), "h4:7070")), "h4:7070");
        assert_eq!(mapped.redirect(&hint(None, "h1:7070")), "h1:7070");
        assert_eq!(plain.redirect(&hint(Some(1), "h1:7070")), "h1:7070");
    }
}
