//! A request body that is read to its end even when the call is answered without it.
//!
//! A call refused before its body is read (shed past the in-flight cap, an unknown token, a
//! caller over its rate, a message too large) leaves the body unread. The HTTP/2 server then
//! resets the stream, and h2 charges every small DATA frame that still arrives on the reset
//! stream to the connection's budget for good: a gateway refused a few thousand times had its
//! connection closed (GOAWAY `ENHANCE_YOUR_CALM`, "too_many_data_frames"), and its admitted
//! calls in flight on that connection failed with it. Over HTTP/1.1 an unread body costs the
//! connection too (it cannot be reused). So every gateway call's body is wrapped in
//! [`DrainOnDrop`]: dropped before its end, it is read to the end on a task of its own, after
//! the answer has gone out, bounded by [`DRAIN_REFUSED_BODY`].

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http_body::{Body, Frame, SizeHint};

/// How long an unread body may take to end before it is dropped (and its stream reset). A
/// gateway sends its body with its headers; this bounds one that does not. Each drain lives
/// on an open HTTP/2 stream, so the connection's stream cap bounds how many run at once.
pub const DRAIN_REFUSED_BODY: Duration = Duration::from_secs(1);

/// A body that, dropped before its end, is drained in the background (see the module's note).
/// The common call reads its body to the end and pays one `is_end_stream` check on drop.
#[derive(Debug)]
pub struct DrainOnDrop<B: Body + Send + Unpin + 'static> {
    /// `None` once the body has ended.
    body: Option<B>,
}

impl<B: Body + Send + Unpin + 'static> DrainOnDrop<B> {
    pub fn new(body: B) -> Self {
        Self { body: Some(body) }
    }
}

impl<B: Body + Send + Unpin + 'static> Body for DrainOnDrop<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let Some(body) = self.body.as_mut() else {
            return Poll::Ready(None);
        };
        let frame = Pin::new(body).poll_frame(cx);
        if let Poll::Ready(None) = frame {
            self.body = None;
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.body.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.body
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), Body::size_hint)
    }
}

impl<B: Body + Send + Unpin + 'static> Drop for DrainOnDrop<B> {
    fn drop(&mut self) {
        let Some(body) = self.body.take() else {
            return;
        };
        if body.is_end_stream() {
            return;
        }
        // Outside a runtime (a test dropping a request) there is no connection to keep.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(drain(body));
        }
    }
}

/// Reads `body` to its end, discarding it, for at most [`DRAIN_REFUSED_BODY`]. A frame that
/// fails ends it: the stream is gone already.
async fn drain<B: Body + Unpin>(mut body: B) {
    let to_the_end = async {
        while let Some(Ok(_)) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await
        {
        }
    };
    let _ = tokio::time::timeout(DRAIN_REFUSED_BODY, to_the_end).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A body of `frames` one-byte frames that counts how many were read.
    struct Counted {
        left: usize,
        read: Arc<AtomicUsize>,
    }

    impl Body for Counted {
        type Data = axum::body::Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<axum::body::Bytes>, Self::Error>>> {
            if self.left == 0 {
                return Poll::Ready(None);
            }
            self.left -= 1;
            self.read.fetch_add(1, Ordering::Relaxed);
            Poll::Ready(Some(Ok(Frame::data(axum::body::Bytes::from_static(b"x")))))
        }

        fn is_end_stream(&self) -> bool {
            self.left == 0
        }
    }

    fn counted(frames: usize) -> (Counted, Arc<AtomicUsize>) {
        let read = Arc::new(AtomicUsize::new(0));
        let body = Counted {
            left: frames,
            read: read.clone(),
        };
        (body, read)
    }

    #[tokio::test]
    async fn a_body_dropped_unread_is_read_to_its_end_in_the_background() {
        let (body, read) = counted(5);
        drop(DrainOnDrop::new(body));
        for _ in 0..100 {
            if read.load(Ordering::Relaxed) == 5 {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("drained {} of 5 frames", read.load(Ordering::Relaxed));
    }

    #[tokio::test]
    async fn a_body_read_to_its_end_is_passed_through_whole_and_not_drained_again() {
        let (body, read) = counted(3);
        let mut wrapped = DrainOnDrop::new(body);
        let mut frames = 0;
        while let Some(Ok(_)) =
            std::future::poll_fn(|cx| Pin::new(&mut wrapped).poll_frame(cx)).await
        {
            frames += 1;
        }
        assert_eq!(frames, 3);
        assert!(wrapped.is_end_stream());
        drop(wrapped);
        tokio::task::yield_now().await;
        assert_eq!(read.load(Ordering::Relaxed), 3, "nothing read twice");
    }
}
