//! The epoch ticker that bounds a policy call's wall time, awake only while a call is in flight.

use super::*;

/// Advances the engine's epoch every `EPOCH_TICK`, but only while at least one evaluation is in
/// flight: otherwise the thread waits on a condition variable, so an idle process (a `watch` sidecar
/// between cycles) gets no wakeups from the policy engine. It holds only a weak reference to the
/// engine, and is stopped and joined on drop so nothing outlives the engine.
pub(super) struct Ticker {
    shared: Arc<TickerShared>,
    thread: Option<JoinHandle<()>>,
}

pub(super) struct TickerShared {
    state: Mutex<TickerState>,
    wake: Condvar,
}

#[derive(Default)]
pub(super) struct TickerState {
    /// Evaluations running now (each holds an `InFlight`).
    in_flight: usize,
    stop: bool,
}

impl TickerShared {
    fn lock(&self) -> MutexGuard<'_, TickerState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Keeps the ticker running while an evaluation is in flight.
pub(super) struct InFlight<'a>(&'a TickerShared);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.lock().in_flight -= 1;
    }
}

impl Ticker {
    pub(super) fn start(engine: &Engine) -> Result<Self, PolicyError> {
        let weak = engine.weak();
        let shared = Arc::new(TickerShared {
            state: Mutex::new(TickerState::default()),
            wake: Condvar::new(),
        });
        let ticker = shared.clone();
        let thread = std::thread::Builder::new()
            .name("jitship-policy-epoch".into())
            .spawn(move || {
                let mut state = ticker.lock();
                loop {
                    if state.stop {
                        return;
                    }
                    if state.in_flight == 0 {
                        state = ticker
                            .wake
                            .wait(state)
                            .unwrap_or_else(PoisonError::into_inner);
                        continue;
                    }
                    // One tick, releasing the lock so evaluations can start and end meanwhile. An
                    // early wakeup (another evaluation starting) ticks early: deadlines allow for
                    // one extra tick (`deadline_ticks`).
                    state = ticker
                        .wake
                        .wait_timeout(state, EPOCH_TICK)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0;
                    if state.in_flight > 0 && !state.stop {
                        match weak.upgrade() {
                            Some(engine) => engine.increment_epoch(),
                            None => return,
                        }
                    }
                }
            })
            .map_err(|e| PolicyError::Load(format!("cannot start the epoch ticker thread: {e}")))?;
        Ok(Self {
            shared,
            thread: Some(thread),
        })
    }

    /// Marks an evaluation in flight until the guard drops; wakes the ticker on the first one.
    pub(super) fn enter(&self) -> InFlight<'_> {
        let mut state = self.shared.lock();
        state.in_flight += 1;
        if state.in_flight == 1 {
            self.shared.wake.notify_one();
        }
        InFlight(&self.shared)
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.wake.notify_one();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
