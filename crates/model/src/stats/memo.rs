//! Per-thread memory of pure numeric functions, by their arguments' exact bits.
//!
//! Why: building a profile asks the same bounds again and again. A build's cc1 processes
//! each have a stack with the same sample count, sizes and interval as the next one's, so
//! its gamma and negative-binomial quantiles and its normal `z` are the same numbers; each
//! is a root search (or an inverse error function) costing microseconds. A remembered value
//! is the very value computed (same arguments, same function): no estimate changes.

use std::{cell::RefCell, collections::HashMap, thread::LocalKey};

/// Values kept per function and thread; past that, all are forgotten at once (a bound on
/// memory, ~3 MiB at most, rather than an eviction policy).
pub const ENTRIES: usize = 1 << 16;

/// One function's memory on one thread.
pub type Memo<const N: usize> = RefCell<HashMap<[u64; N], f64>>;

/// `compute()`, or what it returned before for the same `arguments` on this thread.
pub fn remembered<const N: usize>(
    memo: &'static LocalKey<Memo<N>>,
    arguments: [f64; N],
    compute: impl FnOnce() -> f64,
) -> f64 {
    let key = arguments.map(f64::to_bits);
    if let Some(known) = memo.with(|memo| memo.borrow().get(&key).copied()) {
        return known;
    }
    let value = compute();
    memo.with(|memo| {
        let mut memo = memo.borrow_mut();
        if memo.len() >= ENTRIES {
            memo.clear();
        }
        memo.insert(key, value);
    });
    value
}

thread_local! {
    static Z: Memo<1> = RefCell::new(HashMap::new());
}

/// The standard normal's `p` quantile (`z` for a tail of `1 − p`), remembered.
pub fn normal_quantile(p: f64) -> f64 {
    use statrs::distribution::{ContinuousCDF as _, Normal};
    remembered(&Z, [p], || Normal::standard().inverse_cdf(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    thread_local! {
        static CALLS: Memo<2> = RefCell::new(HashMap::new());
    }

    #[test]
    fn a_value_is_computed_once_per_arguments_and_returned_as_computed() {
        let computed = std::cell::Cell::new(0);
        let ask = |a: f64, b: f64| {
            remembered(&CALLS, [a, b], || {
                computed.set(computed.get() + 1);
                a / b
            })
        };
        assert_eq!(ask(1.0, 3.0), 1.0 / 3.0);
        assert_eq!(ask(1.0, 3.0), 1.0 / 3.0);
        assert_eq!(ask(3.0, 1.0), 3.0);
        // Exact bits: -0.0 is not 0.0, and NaN arguments are remembered as themselves.
        assert_eq!(ask(-0.0, 1.0), 0.0);
        assert_eq!(ask(0.0, 1.0), 0.0);
        assert_eq!(computed.get(), 4);
    }

    #[test]
    fn the_normal_quantile_is_statrs_s() {
        use statrs::distribution::{ContinuousCDF as _, Normal};
        for p in [0.5, 0.975, 0.995, 1.0 - 1e-9, 0.025] {
            let theirs = Normal::standard().inverse_cdf(p);
            assert_eq!(normal_quantile(p), theirs);
            assert_eq!(normal_quantile(p), theirs, "remembered");
        }
    }
}
