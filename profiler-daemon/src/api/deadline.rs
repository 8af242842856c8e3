//! A stream whose writes must make progress: a client that sends requests and never reads
//! the answers fills its socket buffer, and without a deadline the write, and the
//! connection slot, would wait for ever.

use std::{
    future::Future,
    io,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    time::Sleep,
};

use crate::control::Refusals;

/// `inner`, with every write (and flush, and shutdown) failing with `TimedOut` once it has
/// waited `timeout` without progress. Reads are untouched (hyper times out headers itself).
pub struct WriteDeadline<S> {
    inner: S,
    timeout: Duration,
    /// Armed when a write first waits; disarmed when one makes progress.
    stalled: Option<Pin<Box<Sleep>>>,
    refusals: Arc<Refusals>,
}

impl<S> WriteDeadline<S> {
    pub fn new(inner: S, timeout: Duration, refusals: Arc<Refusals>) -> Self {
        Self { inner, timeout, stalled: None, refusals }
    }

    fn progressed<T>(&mut self, result: Poll<io::Result<T>>, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        if result.is_ready() {
            self.stalled = None;
            return result;
        }
        let timeout = self.timeout;
        let stalled = self.stalled.get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        match stalled.as_mut().poll(cx) {
            Poll::Ready(()) => {
                Refusals::count(&self.refusals.write_timeouts);
                let message = format!("the client read nothing for {timeout:?}");
                Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, message)))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for WriteDeadline<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for WriteDeadline<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.progressed(result, cx)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let result = Pin::new(&mut self.inner).poll_flush(cx);
        self.progressed(result, cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let result = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.progressed(result, cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[tokio::test]
    async fn a_peer_that_never_reads_times_the_write_out() {
        let (ours, _theirs) = tokio::net::UnixStream::pair().unwrap();
        let refusals = Arc::new(Refusals::default());
        let mut stream = WriteDeadline::new(ours, Duration::from_millis(200), Arc::clone(&refusals));
        // Far more than a socket buffer holds; the peer reads nothing.
        let big = vec![0u8; 64 << 20];
        let started = std::time::Instant::now();
        let err = stream.write_all(&big).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
        assert_eq!(refusals.read()[2], ("write_timeouts", 1));
    }

    #[tokio::test]
    async fn a_reading_peer_gets_everything() {
        let (ours, mut theirs) = tokio::net::UnixStream::pair().unwrap();
        let mut stream = WriteDeadline::new(ours, Duration::from_millis(200), Arc::new(Refusals::default()));
        let reader = tokio::spawn(async move {
            let mut all = Vec::new();
            tokio::io::AsyncReadExt::read_to_end(&mut theirs, &mut all).await.unwrap();
            all.len()
        });
        stream.write_all(&vec![1u8; 4 << 20]).await.unwrap();
        stream.shutdown().await.unwrap();
        drop(stream);
        assert_eq!(reader.await.unwrap(), 4 << 20);
    }
}
