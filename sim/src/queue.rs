//! The event queue: ordered by time, then by insertion, so that events due at the same
//! nanosecond run in the order they were scheduled and every run replays exactly.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

use allot_core::time::Timestamp;

struct Queued<E> {
    at: Timestamp,
    seq: u64,
    event: E,
}

impl<E> PartialEq for Queued<E> {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}

impl<E> Eq for Queued<E> {}

impl<E> PartialOrd for Queued<E> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<E> Ord for Queued<E> {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

/// A bounded priority queue of events.
pub struct EventQueue<E> {
    heap: BinaryHeap<Reverse<Queued<E>>>,
    next_seq: u64,
    max_len: usize,
}

/// The queue is full: the scenario schedules more at once than the simulator allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueFull;

impl<E> EventQueue<E> {
    pub fn new(max_len: usize) -> Self {
        EventQueue {
            heap: BinaryHeap::new(),
            next_seq: 0,
            max_len,
        }
    }

    pub fn push(&mut self, at: Timestamp, event: E) -> Result<(), QueueFull> {
        if self.heap.len() >= self.max_len {
            return Err(QueueFull);
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.heap.push(Reverse(Queued { at, seq, event }));
        Ok(())
    }

    pub fn peek_time(&self) -> Option<Timestamp> {
        self.heap.peek().map(|Reverse(q)| q.at)
    }

    pub fn pop(&mut self) -> Option<(Timestamp, E)> {
        self.heap.pop().map(|Reverse(q)| (q.at, q.event))
    }

    pub fn len(&self) -> usize {
        self.heap.len()
    }

    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn earlier_first_then_in_insertion_order() {
        let mut q = EventQueue::new(10);
        let t = |n| Timestamp::from_unix_nanos(n);
        q.push(t(5), "b1").unwrap();
        q.push(t(3), "a").unwrap();
        q.push(t(5), "b2").unwrap();
        q.push(t(9), "c").unwrap();
        q.push(t(5), "b3").unwrap();
        let order: Vec<_> = std::iter::from_fn(|| q.pop().map(|(_, e)| e)).collect();
        assert_eq!(order, vec!["a", "b1", "b2", "b3", "c"]);
    }

    #[test]
    fn the_queue_is_bounded() {
        let mut q = EventQueue::new(2);
        q.push(Timestamp::ZERO, 1).unwrap();
        q.push(Timestamp::ZERO, 2).unwrap();
        assert_eq!(q.push(Timestamp::ZERO, 3), Err(QueueFull));
        assert_eq!(q.len(), 2);
    }
}
