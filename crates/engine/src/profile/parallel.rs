//! Mapping a list on a few threads, order kept: for the pure, CPU-bound per-stack work of
//! building a profile (estimates and their bounds), which the user waits for at the end
//! of every recording. Small lists stay on the calling thread (a thread costs more).

/// Items per thread below which no thread is started for them.
const PER_THREAD: usize = 64;
/// Most threads used (the work is a few tens of milliseconds).
const MAX_THREADS: usize = 4;

/// `items` mapped by `f`, in order; on up to [`MAX_THREADS`] threads (one per CPU) when
/// there are more than [`PER_THREAD`] items. A panic in `f` is resumed here.
pub(super) fn map<T: Send, R: Send>(items: Vec<T>, f: impl Fn(T) -> R + Sync) -> Vec<R> {
    let threads = std::thread::available_parallelism()
        .map_or(1, usize::from)
        .clamp(1, MAX_THREADS)
        .min(items.len().div_ceil(PER_THREAD));
    if threads <= 1 {
        return items.into_iter().map(f).collect();
    }
    let chunk = items.len().div_ceil(threads);
    let mut items = items.into_iter();
    let chunks: Vec<Vec<T>> = (0..threads)
        .map(|_| items.by_ref().take(chunk).collect())
        .collect();
    let f = &f;
    std::thread::scope(|scope| {
        let handles: Vec<_> = chunks
            .into_iter()
            .map(|chunk| scope.spawn(move || chunk.into_iter().map(f).collect::<Vec<R>>()))
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_is_kept_for_small_and_large_lists() {
        for n in [0usize, 1, 63, 64, 65, 1000, 1001] {
            let items: Vec<usize> = (0..n).collect();
            let mapped = map(items, |i| i * 3);
            assert_eq!(mapped, (0..n).map(|i| i * 3).collect::<Vec<_>>(), "n = {n}");
        }
    }
}
