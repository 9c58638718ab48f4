//! A gRPC request body checked for its framing as it passes to tonic's decoder, so that a
//! malformed body is answered as the client's fault. tonic answers INTERNAL for a body
//! that ends inside a message (a length prefix longer than what follows), for one that
//! holds no message, and for a compressed-flag byte other than 0 or 1; those are the
//! client's, so they answer INVALID_ARGUMENT saying what was wrong.
//!
//! What tonic answers as the gRPC protocol asks is left to it: a message longer than the
//! largest taken is OUT_OF_RANGE, a `grpc-encoding` not supported UNIMPLEMENTED, and the
//! compressed flag set without a `grpc-encoding` INTERNAL, as the protocol's compression
//! document requires (grpc-go, which envoyproxy/ratelimit serves with, answers it so too).

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http_body::{Body, Frame, SizeHint};
use tonic::Status;
use tonic::codegen::{Bytes, StdError};

/// The bytes before each message: the compressed flag and the length (big-endian).
const PREFIX_BYTES: usize = 5;

/// A request body whose gRPC framing is followed, byte by byte, as tonic reads it.
pub(super) struct CheckedFrames<B> {
    inner: B,
    /// The prefix of the message being read, and how much of it has arrived.
    prefix: [u8; PREFIX_BYTES],
    prefix_read: usize,
    /// Bytes of the current message still to come, after its prefix.
    message_left: u64,
    /// Prefixes read in full.
    messages: u64,
}

impl<B> CheckedFrames<B> {
    pub(super) fn new(inner: B) -> Self {
        CheckedFrames {
            inner,
            prefix: [0; PREFIX_BYTES],
            prefix_read: 0,
            message_left: 0,
            messages: 0,
        }
    }

    /// Follows `data` through the framing; an error for a compressed flag that is neither
    /// 0 nor 1.
    fn follow(&mut self, mut data: &[u8]) -> Result<(), Status> {
        while !data.is_empty() {
            if self.message_left > 0 {
                let taken = data
                    .len()
                    .min(usize::try_from(self.message_left).unwrap_or(usize::MAX));
                self.message_left -= taken as u64;
                data = &data[taken..];
                continue;
            }
            let taken = data.len().min(PREFIX_BYTES - self.prefix_read);
            self.prefix[self.prefix_read..self.prefix_read + taken].copy_from_slice(&data[..taken]);
            self.prefix_read += taken;
            data = &data[taken..];
            if self.prefix_read == PREFIX_BYTES {
                let flag = self.prefix[0];
                if flag > 1 {
                    return Err(Status::invalid_argument(format!(
                        "malformed gRPC frame: compressed flag {flag} (valid flags are 0 and 1)"
                    )));
                }
                let length = u32::from_be_bytes([
                    self.prefix[1],
                    self.prefix[2],
                    self.prefix[3],
                    self.prefix[4],
                ]);
                self.message_left = u64::from(length);
                self.prefix_read = 0;
                self.messages += 1;
            }
        }
        Ok(())
    }

    /// At the body's end: an error if it ended inside a message, or held none.
    fn ended(&self) -> Result<(), Status> {
        if self.prefix_read > 0 {
            return Err(Status::invalid_argument(format!(
                "malformed gRPC frame: the body ends {} bytes into a 5-byte message prefix",
                self.prefix_read
            )));
        }
        if self.message_left > 0 {
            return Err(Status::invalid_argument(format!(
                "malformed gRPC frame: the body ends {} bytes short of the message its \
                 length prefix announces",
                self.message_left
            )));
        }
        if self.messages == 0 {
            return Err(Status::invalid_argument(
                "malformed gRPC frame: the body holds no message",
            ));
        }
        Ok(())
    }

    /// Between messages: the body may end here.
    fn at_boundary(&self) -> bool {
        self.prefix_read == 0 && self.message_left == 0 && self.messages > 0
    }
}

impl<B> Body for CheckedFrames<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<StdError>,
{
    type Data = Bytes;
    type Error = StdError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, StdError>>> {
        let this = self.get_mut();
        let frame = match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
            Some(Ok(frame)) => frame,
            Some(Err(e)) => return Poll::Ready(Some(Err(e.into()))),
            None => {
                return Poll::Ready(this.ended().err().map(|status| Err(status.into())));
            }
        };
        if let Some(data) = frame.data_ref()
            && let Err(status) = this.follow(data)
        {
            return Poll::Ready(Some(Err(status.into())));
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        // Not at an end tonic would take for a good one: the error is still to come.
        self.inner.is_end_stream() && self.at_boundary()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn followed(chunks: &[&[u8]]) -> Result<(), Status> {
        let mut frames = CheckedFrames::new(());
        for chunk in chunks {
            frames.follow(chunk)?;
        }
        frames.ended()
    }

    #[test]
    fn whole_messages_in_any_chunks_pass() {
        assert!(followed(&[&[0, 0, 0, 0, 2, 7, 7]]).is_ok());
        assert!(followed(&[&[0, 0], &[0, 0, 2, 7], &[7]]).is_ok());
        assert!(followed(&[&[0, 0, 0, 0, 0]]).is_ok(), "an empty message");
        assert!(
            followed(&[&[1, 0, 0, 0, 1, 9]]).is_ok(),
            "compression is tonic's"
        );
    }

    #[test]
    fn a_body_ending_inside_a_message_is_invalid_argument() {
        for (chunks, says) in [
            (&[&[0u8, 0, 0, 0, 9, 1, 2][..]][..], "7 bytes short"),
            (&[&[0, 0, 0, 0, 9, 1, 2], &[3]], "6 bytes short"),
            (
                &[&[0, 0, 0, 0, 1, 1], &[0, 0]],
                "2 bytes into a 5-byte message prefix",
            ),
            (&[], "holds no message"),
        ] {
            let status = followed(chunks).unwrap_err();
            assert_eq!(status.code(), tonic::Code::InvalidArgument);
            assert!(status.message().contains(says), "{}", status.message());
        }
    }

    #[test]
    fn a_compressed_flag_other_than_0_or_1_is_invalid_argument() {
        let status = followed(&[&[2, 0, 0, 0, 0]]).unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(status.message().contains("compressed flag 2"));
    }
}
