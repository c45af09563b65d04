//! The answers of one [`super::Node::submit`].

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::sync::oneshot;

use super::SendError;
use crate::core::{self, SendReceipt};

/// The node's answers to one handed-over part of a submit, in order.
pub(super) type PartAnswer = Vec<Result<SendReceipt, core::SendError>>;

/// Answers of one [`super::Node::submit`]: a future of one result per
/// message, in the order given, each after its commit (or refusal).
#[derive(Debug)]
#[must_use = "the receipts say which messages were committed"]
pub struct Receipts {
    parts: VecDeque<Part>,
    done: Vec<Result<SendReceipt, SendError>>,
}

#[derive(Debug)]
enum Part {
    /// `n` messages handed to the node; their answers come on `rx`.
    Queued {
        n: usize,
        rx: oneshot::Receiver<PartAnswer>,
    },
    /// `n` messages the node never took: it had stopped.
    Stopped(usize),
}

impl Receipts {
    pub(super) fn new(capacity: usize) -> Self {
        Receipts {
            parts: VecDeque::new(),
            done: Vec::with_capacity(capacity),
        }
    }

    pub(super) fn queued(&mut self, n: usize, rx: oneshot::Receiver<PartAnswer>) {
        self.parts.push_back(Part::Queued { n, rx });
    }

    pub(super) fn stopped(&mut self, n: usize) {
        self.parts.push_back(Part::Stopped(n));
    }
}

impl Future for Receipts {
    type Output = Vec<Result<SendReceipt, SendError>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        while let Some(part) = this.parts.front_mut() {
            let (n, answers) = match part {
                Part::Stopped(n) => (*n, Vec::new()),
                Part::Queued { n, rx } => match Pin::new(rx).poll(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Ok(answers)) => (*n, answers),
                    Poll::Ready(Err(_)) => (*n, Vec::new()),
                },
            };
            this.parts.pop_front();
            debug_assert!(answers.is_empty() || answers.len() == n);
            let got = answers.len();
            this.done
                .extend(answers.into_iter().map(|r| r.map_err(SendError::Refused)));
            // A part the node dropped unanswered: it stopped first.
            this.done.extend((got..n).map(|_| Err(SendError::Stopped)));
        }
        Poll::Ready(std::mem::take(&mut this.done))
    }
}
