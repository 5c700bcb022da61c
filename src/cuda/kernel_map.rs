//! The engine's loaded kernels, one per config, made on first use. Generic over the value and
//! the function that makes it, so that its locking is tested here without a GPU.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex};

/// A map whose values are made on first use by a fallible function.
pub struct OnceMap<K, V> {
    slots: Mutex<HashMap<K, Arc<V>>>,
}

impl<K: Eq + Hash + Clone, V> Default for OnceMap<K, V> {
    fn default() -> Self {
        OnceMap {
            slots: Mutex::new(HashMap::new()),
        }
    }
}

impl<K: Eq + Hash + Clone, V> OnceMap<K, V> {
    /// The value of `key`, made by `init` if there is none yet.
    pub fn get_or_try_init<E>(&self, key: &K, init: impl FnOnce() -> Result<V, E>) -> Result<Arc<V>, E> {
        // A poisoned lock only means another thread panicked mid-insert; the map is still valid.
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(v) = slots.get(key) {
            return Ok(v.clone());
        }
        let v = Arc::new(init()?);
        slots.insert(key.clone(), v.clone());
        Ok(v)
    }

    /// How many values have been made.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.slots.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}
