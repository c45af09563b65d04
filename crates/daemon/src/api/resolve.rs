//! Names of nodes and agents: `AGENT@NODE`, where a node is its id, a
//! local alias (`mesh peer name`) or the name its card announces (this
//! node's own included). A name
//! that matches more than one node is an error listing them, never a
//! guess.

use mesh_protocol::{AgentName, NodeId};

use super::{ApiError, ApiState, CallerError, NotFound};

impl ApiState {
    /// The node `text` names: a node id, a local alias or an announced name.
    pub(super) fn resolve_node(&self, text: &str) -> Result<NodeId, ApiError> {
        let text = text.trim();
        if let Ok(id) = mesh_protocol::parse_node_id(text) {
            return Ok(id);
        }
        let mut found: Vec<(&'static str, NodeId)> = Vec::new();
        if let Some(id) = self.aliases().get(text) {
            found.push(("alias", *id));
        }
        for (name, id) in self.announced_names() {
            if name == text && !found.iter().any(|(_, f)| *f == id) {
                found.push(("name", id));
            }
        }
        match found.as_slice() {
            [] => Err(NotFound::UnknownName(super::routes::cut(text)).into()),
            [(_, id)] => Ok(*id),
            many => {
                let list: Vec<String> = many
                    .iter()
                    .map(|(how, id)| format!("{how} of {id}"))
                    .collect();
                Err(CallerError::AmbiguousName(format!(
                    "{text:?} names more than one node: {}; use a node id",
                    list.join(", ")
                ))
                .into())
            }
        }
    }

    /// As [`ApiState::resolve_node`], but a text that is neither a node id
    /// nor a known name is refused as a bad node id (what a command that
    /// expects an id says).
    pub(super) fn resolve_peer_arg(&self, text: &str) -> Result<NodeId, ApiError> {
        match self.resolve_node(text) {
            Err(e) if matches!(e.kind(), super::ErrorKind::NotFound(_)) => {
                super::routes::parse_node_id(text)
            }
            other => other,
        }
    }

    /// The recipient `text` names: `AGENT@NODE` or a node alone.
    pub(super) fn resolve_recipient(
        &self,
        text: &str,
    ) -> Result<(NodeId, Option<AgentName>), ApiError> {
        match text.trim().rsplit_once('@') {
            Some((agent, node)) => {
                let agent =
                    AgentName::new(agent).map_err(|e| CallerError::BadValue(e.to_string()))?;
                Ok((self.resolve_node(node)?, Some(agent)))
            }
            None => Ok((self.resolve_node(text)?, None)),
        }
    }

    /// The node names this node and its peers announce: the name in the
    /// newest card held of each. This is the one place the lookup goes.
    fn announced_names(&self) -> Vec<(String, NodeId)> {
        self.inner
            .bus
            .node_names()
            .iter()
            .map(|(id, name)| (name.to_string(), *id))
            .collect()
    }

    /// The node aliases, as in the store.
    pub(super) fn aliases(
        &self,
    ) -> std::sync::RwLockReadGuard<'_, std::collections::BTreeMap<String, NodeId>> {
        // Replaced whole under the lock.
        self.inner.aliases.read().unwrap_or_else(|p| p.into_inner())
    }

    /// The alias of `node`, if it has one.
    pub(super) fn alias_of(&self, node: &NodeId) -> Option<String> {
        self.aliases()
            .iter()
            .find(|(_, n)| *n == node)
            .map(|(a, _)| a.clone())
    }

    /// Sets (or with `None` removes) `node`'s alias in the cache.
    pub(super) fn set_alias(&self, node: NodeId, alias: Option<&str>) {
        let mut aliases = self
            .inner
            .aliases
            .write()
            .unwrap_or_else(|p| p.into_inner());
        aliases.retain(|_, n| *n != node);
        if let Some(a) = alias {
            aliases.insert(a.to_owned(), node);
        }
    }
}
