//! The process's channels, one per container, bounded: past
//! [`ChannelConfig::max_channels`] the least recently used is dropped (its exec closes once the
//! calls still holding a lease on it end), so memory does not grow with the number of
//! sandboxes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bollard::Docker;

use super::{Channel, ChannelConfig};

/// The channels of one process (see the module docs). Cheap to share (`Arc`).
#[derive(Debug)]
pub struct Channels {
    docker: Docker,
    config: ChannelConfig,
    map: Mutex<HashMap<String, (Arc<Channel>, Instant)>>,
}

impl Channels {
    /// No channel open yet; each opens on its first use.
    pub fn new(docker: Docker, config: ChannelConfig) -> Arc<Self> {
        Arc::new(Channels {
            docker,
            config,
            map: Mutex::new(HashMap::new()),
        })
    }

    /// The channel to `container`'s agent, made (not yet opened) when there is none.
    pub fn get(&self, container: &str) -> Arc<Channel> {
        let now = Instant::now();
        let Ok(mut map) = self.map.lock() else {
            // A poisoned map only loses sharing: the caller still gets a working channel.
            return Channel::new(self.docker.clone(), container, self.config.clone());
        };
        if let Some((channel, used)) = map.get_mut(container) {
            *used = now;
            return Arc::clone(channel);
        }
        let limit = self.config.max_channels.max(1);
        while map.len() >= limit {
            let Some(oldest) = map
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(id, _)| id.clone())
            else {
                break;
            };
            map.remove(&oldest);
        }
        let channel = Channel::new(self.docker.clone(), container, self.config.clone());
        map.insert(container.to_owned(), (Arc::clone(&channel), now));
        channel
    }

    /// Forgets `container`'s channel (the sandbox was deleted): its exec closes with the last
    /// lease on it.
    pub fn remove(&self, container: &str) {
        if let Ok(mut map) = self.map.lock() {
            map.remove(container);
        }
    }

    /// How many channels are kept.
    pub fn len(&self) -> usize {
        self.map.lock().map(|m| m.len()).unwrap_or(0)
    }

    /// Whether none is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    /// A client of a socket path that exists but is never dialled: channels are made, not
    /// opened, here.
    fn docker(dir: &tempfile::TempDir) -> Docker {
        let path = dir.path().join("docker.sock");
        std::fs::write(&path, b"").unwrap();
        Docker::connect_with_unix(path.to_str().unwrap(), 5, bollard::API_DEFAULT_VERSION).unwrap()
    }

    #[test]
    fn the_map_is_bounded_and_evicts_the_least_recently_used() {
        let config = ChannelConfig {
            max_channels: 3,
            ..ChannelConfig::default()
        };
        let dir = tempfile::tempdir().unwrap();
        let channels = Channels::new(docker(&dir), config);
        let a = channels.get("a");
        channels.get("b");
        channels.get("c");
        // `a` used again: `b` is now the oldest.
        assert!(Arc::ptr_eq(&a, &channels.get("a")));
        channels.get("d");
        assert_eq!(channels.len(), 3);
        let kept: Vec<String> = {
            let map = channels.map.lock().unwrap();
            let mut ids: Vec<String> = map.keys().cloned().collect();
            ids.sort();
            ids
        };
        assert_eq!(kept, ["a", "c", "d"]);
        for i in 0..100 {
            channels.get(&format!("x{i}"));
        }
        assert_eq!(channels.len(), 3);
        channels.remove("x99");
        assert_eq!(channels.len(), 2);
    }
}
