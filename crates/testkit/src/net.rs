//! A real controller on a simulated network, in simulated time (turmoil).
//!
//! The controller is `tollgate server`'s own [`Controller`], served by
//! [`tollgate_controller::serve`] over turmoil's listener; clients reach it with a tonic channel
//! whose connector opens turmoil streams ([`channel`]). Time is turmoil's: `tokio::time` inside
//! the simulation is simulated, so a test of minutes runs in a moment, with no real sleeps, and
//! replays the same way. Its settings live in a [`MemoryStore`] that outlives the controller,
//! so a restart finds what the last incarnation wrote.

use std::cell::RefCell;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tollgate_controller::store::MemoryStore;
use tollgate_controller::{Clock, Controller, Node};
use tollgate_model::engine::EngineSettings;
use tonic::transport::server::{Connected, TcpConnectInfo};
use tonic::transport::{Channel, Endpoint, Uri};
use turmoil::net::TcpStream;

/// The controller's host name on the simulated network.
pub const CONTROLLER: &str = "controller";
/// The controller's gRPC port.
pub const PORT: u16 = 7460;

/// A turmoil stream as tonic's server takes it.
pub struct Accepted(pub TcpStream);

impl Connected for Accepted {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        TcpConnectInfo { local_addr: self.0.local_addr().ok(), remote_addr: self.0.peer_addr().ok() }
    }
}

impl AsyncRead for Accepted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for Accepted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

type Connecting = Pin<Box<dyn Future<Output = std::io::Result<TokioIo<TcpStream>>> + Send>>;

/// A lazily connected channel to `host` on the simulated network.
pub fn channel(host: &str) -> Channel {
    let connector = tower::service_fn(|uri: Uri| {
        Box::pin(async move {
            let authority = uri.authority().map(|a| a.as_str().to_string()).unwrap_or_default();
            Ok::<_, std::io::Error>(TokioIo::new(TcpStream::connect(authority).await?))
        }) as Connecting
    });
    Endpoint::new(format!("http://{host}:{PORT}"))
        .expect("a valid endpoint")
        .connect_timeout(Duration::from_secs(1))
        .connect_with_connector_lazy(connector)
}

/// What a test asks of the simulation between steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Command {
    Crash,
    Start,
}

struct Shared {
    controller: Option<Arc<Controller>>,
    incarnations: u32,
    commands: Vec<Command>,
}

/// What a test running in the simulation holds: the current controller and commands for it.
#[derive(Clone)]
pub struct Net {
    shared: Rc<RefCell<Shared>>,
}

impl Net {
    /// The controller now serving (panics while it is down).
    pub fn controller(&self) -> Arc<Controller> {
        self.shared.borrow().controller.clone().expect("the controller is up")
    }

    /// How many times a controller has started.
    pub fn incarnations(&self) -> u32 {
        self.shared.borrow().incarnations
    }

    /// A channel to the controller.
    pub fn channel(&self) -> Channel {
        channel(CONTROLLER)
    }

    /// Kills the controller at once (no flush, no goodbye: kill -9) and waits until it is down.
    pub async fn crash(&self) {
        self.shared.borrow_mut().commands.push(Command::Crash);
        while self.shared.borrow().controller.is_some() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Starts the controller again over the same store and waits until it serves.
    pub async fn start(&self) {
        let before = self.incarnations();
        self.shared.borrow_mut().commands.push(Command::Start);
        while self.incarnations() == before {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Kills the controller and starts it again.
    pub async fn restart(&self) {
        self.crash().await;
        self.start().await;
    }
}

/// Runs `test` as a client of a controller with `settings`, flushing every second, on a
/// simulated network; returns once `test` completes. Panics if it fails.
pub fn run<F, Fut>(settings: EngineSettings, store: MemoryStore, test: F)
where
    F: FnOnce(Net) -> Fut,
    Fut: Future<Output = ()> + 'static,
{
    let mut sim = turmoil::Builder::new()
        .simulation_duration(Duration::from_secs(24 * 3600))
        .tick_duration(Duration::from_millis(1))
        .min_message_latency(Duration::from_micros(100))
        .max_message_latency(Duration::from_micros(500))
        .rng_seed(7)
        .build();
    let shared = Rc::new(RefCell::new(Shared { controller: None, incarnations: 0, commands: Vec::new() }));
    let host = shared.clone();
    sim.host(CONTROLLER, move || {
        let (settings, store, shared) = (settings.clone(), store.clone(), host.clone());
        async move {
            let clock = Clock::new();
            let node = Node::open(Box::new(store), settings, clock.now(), tollgate_controller::wall_ms())?;
            let controller = node.controller.clone();
            {
                let mut s = shared.borrow_mut();
                s.controller = Some(controller.clone());
                s.incarnations += 1;
            }
            let addr = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), PORT);
            let listener = turmoil::net::TcpListener::bind(addr).await?;
            let incoming = futures_util::stream::unfold(listener, |l| async move {
                let next = l.accept().await.map(|(s, _)| Accepted(s));
                Some((next, l))
            });
            tollgate_controller::serve(
                node,
                clock,
                Duration::from_secs(1),
                incoming,
                None,
                tollgate_controller::front::guard::Front::default(),
                std::future::pending(),
            )
            .await?;
            Ok(())
        }
    });
    let net = Net { shared: shared.clone() };
    let body = test(net);
    sim.client("test", async move {
        // Let the controller bind before the test's first call.
        tokio::time::sleep(Duration::from_millis(5)).await;
        body.await;
        Ok(())
    });
    drive(&mut sim, &shared);
}

/// How long, at most, a step waits for the server's work on real threads: long enough for a
/// tick of a test's few groups on a machine many tests share, bounded so that work that
/// waits on the simulation itself (none does today) slows a run rather than hangs it.
const BLOCKING_WAIT_MAX: Duration = Duration::from_secs(5);

/// Waits, in real time, until the server's work on the blocking pool (ticks, flushes) has run
/// ([`tollgate_controller::blocking`]): such work then takes no simulated time, however busy
/// the machine, and a run replays the same way. Without it a tick slowed by a loaded machine
/// spans simulated milliseconds, and what a test sees depends on the machine.
fn settle_blocking_work() {
    const PAUSE: Duration = Duration::from_micros(50);
    let mut waited = Duration::ZERO;
    while tollgate_controller::blocking::in_flight() > 0 && waited < BLOCKING_WAIT_MAX {
        std::thread::sleep(PAUSE);
        waited += PAUSE;
    }
}

/// Steps `sim` until the test is done, crashing and restarting the controller as the test
/// asks between steps.
fn drive(sim: &mut turmoil::Sim<'_>, shared: &Rc<RefCell<Shared>>) {
    loop {
        let commands: Vec<Command> = std::mem::take(&mut shared.borrow_mut().commands);
        for c in commands {
            match c {
                Command::Crash => {
                    sim.crash(CONTROLLER);
                    shared.borrow_mut().controller = None;
                }
                Command::Start => sim.bounce(CONTROLLER),
            }
        }
        settle_blocking_work();
        match sim.step() {
            Ok(true) => return,
            Ok(false) => {}
            Err(e) => panic!("simulation failed: {e}"),
        }
    }
}
