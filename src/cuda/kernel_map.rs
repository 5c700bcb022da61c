//! The engine's loaded kernels, one per config, made on first use. Generic over the value and
//! the function that makes it, so that its locking is tested here without a GPU.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex};

/// A map whose values are made on first use by a fallible function, with a once-cell per key:
/// the map's lock is held only to find or add a key's cell, never while a value is made (an NVRTC
/// compile takes seconds), so other keys' lookups do not wait. Racing first uses of one key wait
/// on its cell and the value is made once; if making it fails, the cell stays empty and the next
/// use tries again.
pub struct OnceMap<K, V> {
    slots: Mutex<HashMap<K, Slot<V>>>,
}

type Slot<V> = Arc<Mutex<Option<Arc<V>>>>;

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
        // A poisoned lock only means another thread panicked while holding it; what it guards
        // (a map of cells, a cell's value or None) is valid at every point.
        let slot = {
            let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
            slots.entry(key.clone()).or_default().clone()
        };
        let mut value = slot.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(v) = &*value {
            return Ok(v.clone());
        }
        let v = Arc::new(init()?);
        *value = Some(v.clone());
        Ok(v)
    }

    /// How many values have been made.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        let slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        slots
            .values()
            .filter(|s| s.lock().unwrap_or_else(|e| e.into_inner()).is_some())
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::mpsc::channel;
    use std::time::Duration;

    #[test]
    fn a_slow_first_use_blocks_neither_other_keys_nor_makes_twice() {
        let map: Arc<OnceMap<u32, String>> = Arc::new(OnceMap::default());
        let inits = Arc::new(AtomicU32::new(0));
        let (started, has_started) = channel::<()>();
        // Two threads race the first use of key 1, whose (fake) compile waits to be released.
        let racers: Vec<_> = (0..2)
            .map(|_| {
                let (map, inits) = (map.clone(), inits.clone());
                let started = started.clone();
                std::thread::spawn(move || {
                    let _ = started.send(());
                    map.get_or_try_init(&1, || {
                        inits.fetch_add(1, Ordering::SeqCst);
                        std::thread::sleep(Duration::from_millis(300));
                        Ok::<_, ()>("one".to_string())
                    })
                    .unwrap()
                })
            })
            .collect();
        has_started.recv().unwrap();
        std::thread::sleep(Duration::from_millis(50));
        // Key 2 while key 1 compiles: must not wait for it.
        let (done, is_done) = channel();
        let other = {
            let map = map.clone();
            std::thread::spawn(move || {
                let v = map.get_or_try_init(&2, || Ok::<_, ()>("two".to_string())).unwrap();
                let _ = done.send(());
                v
            })
        };
        let waited = is_done.recv_timeout(Duration::from_millis(150));
        let values: Vec<Arc<String>> = racers.into_iter().map(|t| t.join().unwrap()).collect();
        assert_eq!(*other.join().unwrap(), "two");
        assert!(waited.is_ok(), "key 2 waited for key 1's compile");
        assert!(Arc::ptr_eq(&values[0], &values[1]), "both racers get the one value");
        assert_eq!(inits.load(Ordering::SeqCst), 1, "made once");
        assert_eq!(map.len(), 2);
        // A failed init leaves no value: the next use tries again.
        assert_eq!(map.get_or_try_init(&3, || Err::<String, _>("no")), Err("no"));
        assert_eq!(
            *map.get_or_try_init(&3, || Ok::<_, ()>("three".into())).unwrap(),
            "three"
        );
    }
}
