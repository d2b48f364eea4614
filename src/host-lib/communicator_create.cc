// Communicator::create: one rank's verbs communicator, set up in the steps
// of the job plan (job.h) over the job's bootstrap.
//
// Theory of operation
// -------------------
// Each rank checks its arguments, opens the device (VerbsTransport, verbs.h)
// and joins the bootstrap. Then every rank of the job, all together:
//   1. the job header: rank 0 decides the number of stripes R
//      (Options::rings; 0: from the box's worker count), a job nonce and
//      the racks of the box's fabric (ring_order.h);
//   2. locality: an allgather of locality claims numbers hosts and local
//      ranks (local.h). A rank's ring is local rank l of every host, in host
//      order (without local ranks: every rank, in rank order); with local
//      ranks the host's shared segment (LocalGroup, named from the nonce and
//      the host index) is created next;
//   3. the QPs: each rank makes its R lanes; an allgather of every rank's
//      PeerInfo, with the options that must agree, lets each connect its
//      lanes to its ring's successor and predecessor, and a second allgather
//      makes sure every QP is ready before anything is sent;
//   4. the path: rank 0 registers the job's n x R rings (ring l R + s: local
//      rank l's ring, stripe s) in one call and broadcasts the path and
//      their ids;
//   5. the probe on every ring, its verdict gathered over all ranks;
//   6. the cost model's link figures (link_figures.h): measured on the ring
//      (path_choice model on the INA path, no local ranks,
//      Options::measure_links) or configured;
//      rank 0's and its path choice become everyone's;
//   7. with local ranks on the INA path, each ring's own bootstrap, over
//      which its members agree on a failover.
// The communicator then holds the transport, the collective, rank 0's rings
// and the bootstrap (failover's exchange, the barrier at close). local_size
// 1 is the plain communicator: one ring of every rank, the same ids and the
// same wire bytes. A step that fails ends create with its error; what the
// steps made so far is released in the reverse order.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/ring_json.h"
#include "host-lib/bootstrap.h"
#include "host-lib/comm_impl.h"
#include "host-lib/daemon.h"
#include "host-lib/job.h"
#include "host-lib/link_figures.h"
#include "host-lib/local.h"
#include "host-lib/rina_job.h"
#include "host-lib/ring_order.h"
#include "host-lib/verbs.h"

namespace netreduce {
namespace host {
namespace {

// The arguments, before anything is opened or sent.
Error check_arguments(int rank, int world, const Options& options) {
  if (world < 1 || world > 64)
    return Error::make(ErrorCode::invalid_argument,
                       "world: " + std::to_string(world) + " is outside 1..64");
  if (rank < 0 || rank >= world)
    return Error::make(
        ErrorCode::invalid_argument,
        "rank: " + std::to_string(rank) + " is outside 0.." + std::to_string(world - 1));
  if (options.connect_timeout_ms <= 0 || options.op_timeout_ms <= 0 ||
      options.daemon_timeout_ms <= 0)
    return Error::make(ErrorCode::invalid_argument, "timeouts must be positive");
  if (options.rings != 0)
    if (Error e = check_rings(options.rings)) return e;
  if (Error e = check_local_options(options)) return e;
  if (Error e = check_path_choice(options.path_choice)) return e;
  if (Error e = check_ring_order(pinned_ring_order(options), static_cast<unsigned>(world)))
    return e;
  MessagePlan probe;
  return make_plan(0, DataType::fp32, options.msg_len, options.payload_bytes, probe);
}

Error check_arguments(int rank, int world, const std::string& bootstrap, const Options& options) {
  std::string h, err;
  uint16_t p = 0;
  if (!parse_host_port(bootstrap, h, p, err)) return Error::make(ErrorCode::invalid_argument, err);
  return check_arguments(rank, world, options);
}

CollectiveConfig collective_config(const Options& options) {
  CollectiveConfig cc;
  cc.msg_len = options.msg_len;
  cc.pmtu = options.payload_bytes;
  cc.window = options.window ? options.window
                             : window_from_bdp(options.link_gbps, options.rtt_us,
                                               size_t{options.msg_len} * options.payload_bytes);
  return cc;
}

// One rank's way through create: each step a method, each leaving what the
// next needs. The members that own something are declared in the order the
// steps make them, so an error releases them in the reverse order (the
// collective before the rings and the transport it runs on).
class JobSetup {
 public:
  // part: one of a Rina job's communicators (never Rina mode itself,
  // whatever NETREDUCE_RINA says).
  JobSetup(int rank, int world, const std::string& bootstrap, const Options& options,
           bool part = false)
      : rank_(rank),
        world_(world),
        bootstrap_(bootstrap),
        options_(options),
        deadline_(Clock::now() + std::chrono::milliseconds(options.connect_timeout_ms)),
        rina_mode_(!part && rina_mode(options)),
        cc_(collective_config(options)) {}

  // The device, then the job's bootstrap: made, or one already made.
  Error open(const std::string& device, int gid_index);
  Error adopt(const std::string& device, int gid_index, std::unique_ptr<Bootstrap> boot);
  Error open_over(const std::string& device, int gid_index, const Rendezvous& rendezvous);
  Error job_header();           // step 1
  Error locality();             // step 2
  Error connect_qps();          // step 3
  Error decide_path();          // step 4
  Error probe();                // step 5
  Error share_links();          // step 6
  Error join_ring_bootstrap();  // step 7
  Error rina();                 // step 8
  std::unique_ptr<Communicator> communicator();

 private:
  Error gather_peers(const PeerInfo& mine);
  PathDecision register_rings();
  Error fall_back(std::string reason);
  std::string my_rack() const;
  Error open_device(const std::string& device, int gid_index);

  const int rank_, world_;
  const std::string& bootstrap_;
  const Options& options_;
  const Clock::time_point deadline_;
  const bool rina_mode_;
  std::string job_key_;
  CollectiveConfig cc_;
  unsigned R_ = 0;  // stripes: rings per local rank
  uint64_t nonce_ = 0;
  std::vector<FabricRack> fabric_racks_;  // from the job header
  std::vector<std::string> racks_;        // every rank's rack label (its claim)
  std::string device_;
  int gid_index_ = -1;
  Locality loc_;
  std::vector<PeerInfo> all_;  // every rank's, in rank order
  LinkFigures links_;
  double probe_us_ = 0;  // the probe's time through the box (link_figures.h)
  std::unique_ptr<VerbsTransport> t_;
  std::unique_ptr<Bootstrap> boot_;
  std::unique_ptr<LocalGroup> local_;
  std::vector<std::unique_ptr<OwnedRing>> owned_;
  std::unique_ptr<Collective> coll_;
  std::shared_ptr<Bootstrap> ring_boot_;
  std::unique_ptr<RinaJob> rina_;
};

Error JobSetup::open_device(const std::string& device, int gid_index) {
  device_ = device;
  gid_index_ = gid_index;
  t_ = std::make_unique<VerbsTransport>();
  if (Error e = t_->open(static_cast<unsigned>(rank_), static_cast<unsigned>(world_), device,
                         gid_index, options_.port, options_.qp_timeout))
    return e;
  job_key_ = options_.job_key;
  if (const char* env = std::getenv("NETREDUCE_JOB_KEY"); job_key_.empty() && env) job_key_ = env;
  return {};
}

Error JobSetup::open(const std::string& device, int gid_index) {
  if (Error e = open_device(device, gid_index)) return e;
  return Bootstrap::create(static_cast<unsigned>(rank_), static_cast<unsigned>(world_), bootstrap_,
                           job_key_, deadline_, boot_);
}

Error JobSetup::adopt(const std::string& device, int gid_index, std::unique_ptr<Bootstrap> boot) {
  boot_ = std::move(boot);
  return open_device(device, gid_index);
}

// The rendezvous's own TCP bootstraps (local ranks, Rina parts) listen at
// the rank's RoCE address: the one the ring connects to anyway.
Error JobSetup::open_over(const std::string& device, int gid_index, const Rendezvous& rendezvous) {
  if (Error e = open_device(device, gid_index)) return e;
  uint32_t ip = t_->local_info().ipv4;
  if (!options_.ipv4.empty()) ipv4_from_string(options_.ipv4, ip);
  boot_ = Bootstrap::over(static_cast<unsigned>(rank_), static_cast<unsigned>(world_), rendezvous,
                          ip != 0 ? ipv4_to_string(ip) : std::string());
  return {};
}

// Step 1 (job.h): rank 0 decides the number of rings per local ring (the
// stripes R): Options::rings, or for 0 the box's worker count W (the box
// spreads a job's rings over its workers by their QPs: each ring's spec
// names them), 1 without a box or with the ring path forced; with n local
// ranks found in step 2, rings 0 takes max(1, W / n) stripes so that the
// job's n x R rings fill the workers once, not n times. With it, the job
// nonce (shared segments' names), and the racks of the box's fabric
// (ring_order.h). A forced ring path asks the daemon nothing.
Error JobSetup::job_header() {
  std::string header;
  if (rank_ == 0) {
    JobHeader h{options_.rings, random_nonce(), {}};
    const bool workers = h.stripes == 0 && !options_.force_ring;
    BoxOutline box;
    std::string why;
    // Within the job's deadline: the other ranks wait for the header until then.
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - Clock::now());
    const int timeout = static_cast<int>(
        std::clamp<int64_t>(left.count(), 1, std::max(1, options_.daemon_timeout_ms)));
    // Rina mode needs the racks (which have a box) whatever the order.
    if (workers || rina_mode_ || (!options_.force_ring && pinned_ring_order(options_).empty()))
      box = box_outline(daemon_target(options_), timeout, why);
    if (h.stripes == 0) h.stripes = workers ? std::clamp(box.workers, 1u, kMaxRings) : 1u;
    h.racks = std::move(box.racks);
    header = encode_job_header(h);
  }
  if (Error e = boot_->broadcast(header, deadline_)) return e;
  JobHeader h;
  if (Error e = decode_job_header(header, h)) return e;
  R_ = h.stripes;
  nonce_ = h.nonce;
  fabric_racks_ = std::move(h.racks);
  if (Error e = check_rings(R_))
    return Error::make(ErrorCode::bootstrap, "bootstrap: rank 0 sent " + e.message);
  return {};
}

// This rank's rack: its own label, else the fabric's rack of its address.
std::string JobSetup::my_rack() const {
  std::string rack = rack_label(options_);
  if (!rack.empty() || fabric_racks_.empty()) return rack;
  uint32_t ip = t_->local_info().ipv4;
  if (!options_.ipv4.empty()) ipv4_from_string(options_.ipv4, ip);
  return fabric_rack_of(ip, fabric_racks_);
}

// Step 2: locality. Hosts, local ranks, and my ring (local rank l of every host).
Error JobSetup::locality() {
  std::vector<std::string> blobs;
  {
    LocalityClaim mine{host_identity(options_), options_.local_rank, options_.local_size, my_rack(),
                       pinned_ring_order(options_)};
    if (Error e = boot_->allgather(encode_claim(mine), blobs, deadline_)) return e;
  }
  std::vector<LocalityClaim> claims(static_cast<size_t>(world_));
  for (int r = 0; r < world_; ++r)
    if (Error e = decode_claim(blobs[r], static_cast<unsigned>(r), claims[r])) return e;
  for (const LocalityClaim& c : claims) racks_.push_back(c.rack);
  if (Error e = resolve_locality(claims, static_cast<unsigned>(rank_), loc_)) return e;
  const unsigned n = loc_.local_size;
  if (options_.rings == 0) R_ = std::max(1u, R_ / n);
  if (options_.ring_id != 0 && uint64_t{options_.ring_id} + n * R_ - 1 > 0xFFFFFFFFu)
    return Error::make(ErrorCode::invalid_argument, "ring_id: " + std::to_string(options_.ring_id) +
                                                        " + " + std::to_string(n * R_ - 1) +
                                                        " (one id per ring) exceeds 2^32 - 1");
  t_->place(loc_.ring, loc_.host, loc_.local_rank, n);
  // The host's shared segment: every local rank of the host meets here.
  if (n > 1)
    if (Error e = LocalGroup::create(local_segment_name(nonce_, loc_.host), loc_.local_rank, n,
                                     loc_.host, options_.ring_buffer_bytes, deadline_, local_))
      return e;
  return {};
}

// Step 3: QPs of my ring (R lanes), exchanged among all ranks.
Error JobSetup::connect_qps() {
  const size_t recv_bytes = recv_region_bytes(cc_, loc_.hosts, options_.ring_buffer_bytes);
  if (Error e = t_->create_lanes(R_, recv_bytes)) return e;
  PeerInfo mine = t_->local_info();
  mine.world = static_cast<uint32_t>(world_);
  if (!options_.ipv4.empty() && !ipv4_from_string(options_.ipv4, mine.ipv4))
    return Error::make(ErrorCode::invalid_argument,
                       "ipv4: '" + options_.ipv4 + "' is not an IPv4 address");
  mine.msg_len = cc_.msg_len;
  mine.payload_bytes = cc_.pmtu;
  mine.window = cc_.window;
  mine.force_ring = options_.force_ring ? 1 : 0;
  mine.rings_option = options_.rings;
  mine.failback_calls = options_.failback_calls;
  mine.path_choice = static_cast<uint8_t>(options_.path_choice);
  mine.measure_links = options_.measure_links ? 1 : 0;
  mine.rina = rina_mode_ ? 1 : 0;
  if (Error e = gather_peers(mine)) return e;
  {
    std::vector<PeerInfo> ring;
    for (unsigned g : loc_.ring) ring.push_back(all_[g]);
    if (Error e = t_->connect(ring, cc_.pmtu)) return e;
  }
  // Everyone's QPs are ready before anyone sends.
  std::vector<std::string> blobs;
  return boot_->allgather("ready", blobs, deadline_);
}

// Every rank's PeerInfo (all_), each with the options this rank has.
Error JobSetup::gather_peers(const PeerInfo& mine) {
  std::vector<std::string> blobs;
  if (Error e = boot_->allgather(std::string(reinterpret_cast<const char*>(&mine), sizeof mine),
                                 blobs, deadline_))
    return e;
  all_.assign(static_cast<size_t>(world_), PeerInfo{});
  for (int r = 0; r < world_; ++r) {
    if (blobs[r].size() != sizeof(PeerInfo))
      return Error::make(ErrorCode::bootstrap, "bootstrap: rank " + std::to_string(r) +
                                                   " sent malformed connection information");
    std::memcpy(&all_[r], blobs[r].data(), sizeof(PeerInfo));
    const PeerInfo& p = all_[r];
    if (p.magic != mine.magic || p.world != mine.world || p.msg_len != mine.msg_len ||
        p.payload_bytes != mine.payload_bytes || p.window != mine.window ||
        p.recv_len != mine.recv_len || p.force_ring != mine.force_ring || p.rings != mine.rings ||
        p.rings_option != mine.rings_option || p.failback_calls != mine.failback_calls ||
        p.path_choice != mine.path_choice || p.measure_links != mine.measure_links ||
        p.rina != mine.rina)
      return Error::make(ErrorCode::invalid_argument,
                         "rank " + std::to_string(r) +
                             " uses different options (world, msg_len, payload_bytes, window, "
                             "ring_buffer_bytes, force_ring, rings, failback_calls, path_choice, "
                             "measure_links or rina) than rank " +
                             std::to_string(rank_));
  }
  return {};
}

// Step 4: rank 0 decides the path and tells everyone. It owns the rings it
// registered (all n x R of the job): renewed while the communicator lives,
// deleted at the end (or right away when the probe sends every rank to the
// ring path, or create fails after this point).
Error JobSetup::decide_path() {
  std::string decision;
  if (rank_ == 0) decision = encode_decision(register_rings());
  if (Error e = boot_->broadcast(decision, deadline_)) return e;
  PathDecision d;
  if (Error e = decode_decision(decision, loc_.local_size * R_, d)) return e;
  cc_.path = d.ina ? Path::ina : Path::ring;
  cc_.reason = d.reason;
  if (d.ina) cc_.ring_ids = my_ring_ids(d.ring_ids, loc_.local_rank, R_);
  return {};
}

// Rank 0's decision: the job's rings registered with the daemon, or why not.
PathDecision JobSetup::register_rings() {
  const unsigned n = loc_.local_size, H = loc_.hosts;
  // Ring l R + s: local rank l of every host, stripe s; each member's
  // receiving QP of that stripe (qpns) lets the box run the job's rings
  // on different workers.
  std::vector<engine::RingSpec> specs(size_t{n} * R_);
  bool ips = true;
  for (unsigned l = 0; l < n; ++l)
    for (unsigned s = 0; s < R_; ++s) {
      engine::RingSpec& sp = specs[size_t{l} * R_ + s];
      for (unsigned g : loc_.rings[l]) {
        sp.members.push_back(all_[g].ipv4);
        // One ring has nothing to be told apart from: no qpns (so a daemon
        // that does not know the field registers it too).
        if (n * R_ > 1) sp.qpns.push_back(all_[g].qpn_p[s]);
        ips = ips && all_[g].ipv4 != 0;
      }
      sp.msg_len = cc_.msg_len;
      sp.window = cc_.window;
      sp.payload_bytes = cc_.pmtu;
    }
  PathDecision d;
  if (rina_mode_) {
    d.reason = "rina mode: all-reduce through the racks' boxes and a ring across them";
  } else if (options_.force_ring) {
    d.reason = "ring forced by options";
  } else if (H < 2) {
    d.reason = world_ < 2 ? "a single rank needs no box" : "a single host needs no box";
  } else if (!ips) {
    d.reason = "a rank's GID has no IPv4 address (give --ipv4)";
  } else if (std::string why = box_unfit(daemon_target(options_), options_.daemon_timeout_ms,
                                         options_.qp_timeout);
             !why.empty()) {
    d.reason = why;
  } else {
    const Registration reg = setup_job_rings(options_, bootstrap_, specs, R_, owned_);
    d.ina = reg.installed;
    d.reason = reg.reason;
    d.ring_ids = reg.ring_ids;
  }
  return d;
}

// Step 5: the probe on every ring, and its verdict over all ranks.
Error JobSetup::probe() {
  if (Error e = Collective::create(*t_, cc_, coll_)) return e;
  if (cc_.path != Path::ina) return {};
  const unsigned n = loc_.local_size;
  // Trust the box only once a probe all-reduce through it (one element per
  // ring) is right on every rank; otherwise every rank falls back to the
  // ring path together.
  bool confirmed = false;
  std::string why;
  const auto probe_deadline =
      std::max(deadline_, Clock::now() + std::chrono::milliseconds(options_.daemon_timeout_ms));
  std::string ids;
  for (uint32_t id : cc_.ring_ids) ids += (ids.empty() ? "" : ", ") + std::to_string(id);
  const Clock::time_point probe_start = Clock::now();
  const Error probed = probe_box(*coll_, loc_.host, loc_.hosts, probe_deadline, confirmed, why);
  probe_us_ = std::chrono::duration<double, std::micro>(Clock::now() - probe_start).count();
  if (Error e = probed)
    return Error::make(
        e.code,
        "the daemon installed ring" + std::string(R_ > 1 ? "s " : " ") + ids +
            (n > 1 ? " (local rank " + std::to_string(loc_.local_rank) + "'s)" : std::string()) +
            " but the probe all-reduce through the box failed: " + e.message);
  if (n > 1 && !confirmed)
    why = "local rank " + std::to_string(loc_.local_rank) + "'s ring: " + why;
  std::vector<std::string> blobs;
  if (Error e = boot_->allgather(confirmed ? "1" : "0" + why, blobs, deadline_)) return e;
  for (int r = 0; r < world_; ++r)
    if (blobs[r] != "1") return fall_back("rank " + std::to_string(r) + ": " + blobs[r].substr(1));
  return {};
}

// Every rank to the ring path (one rank's probe failed): the rings rank 0
// registered are deleted at once.
Error JobSetup::fall_back(std::string reason) {
  cc_.path = Path::ring;
  cc_.reason = std::move(reason);
  cc_.ring_ids.clear();
  coll_.reset();
  for (auto& o : owned_) o->release(/*rollback=*/true);
  return Collective::create(*t_, cc_, coll_);
}

// Step 6: the link figures every rank's cost model uses: rank 0's, measured
// on its ring (path_choice model only: the measurement's ring traffic is
// for the model) or configured (the ranks' path_choice and measure_links
// agree: gather_peers).
Error JobSetup::share_links() {
  links_ = configured_links(options_);
  if (options_.path_choice == PathChoice::model && options_.measure_links && loc_.local_size < 2 &&
      coll_->path() == Path::ina) {
    LinkFigures mine = links_;  // every rank takes part in the calls
    const auto until =
        std::max(deadline_, Clock::now() + std::chrono::milliseconds(options_.op_timeout_ms));
    if (Error e = measure_links(*coll_, loc_.hosts, probe_us_, until, mine))
      return Error::make(e.code, "measuring the links for the cost model: " + e.message);
    if (rank_ == 0) links_ = mine;
  }
  std::vector<std::string> blobs;
  if (Error e = boot_->allgather(encode_links(options_.path_choice, links_), blobs, deadline_))
    return e;
  PathChoice c{};
  if (!decode_links(blobs[0], c, links_))
    return Error::make(ErrorCode::bootstrap, "bootstrap: rank 0 sent malformed link figures");
  return {};
}

// Step 7: with local ranks, failover agrees among one ring's members (local
// rank l of every host), over a bootstrap of their own.
// Every rank learns whether every ring got one: if one did not (a port
// the network refuses), no ring fails over, as every rank says once.
Error JobSetup::join_ring_bootstrap() {
  if (loc_.local_size < 2 || coll_->path() != Path::ina) return {};
  const auto ring_deadline =
      std::max(deadline_, Clock::now() + std::chrono::milliseconds(options_.daemon_timeout_ms));
  std::unique_ptr<Bootstrap> rb;
  const Error mine = ring_bootstrap(*boot_, loc_, job_key_, ring_deadline, rb);
  std::vector<std::string> blobs;
  if (Error e = boot_->allgather(mine.ok() ? "1" : "0" + mine.message, blobs, ring_deadline))
    return e;
  ring_boot_ = std::move(rb);
  for (int r = 0; r < world_ && ring_boot_; ++r)
    if (blobs[r] != "1") {
      std::fprintf(stderr, "netreduce: rank %d: no failover to the ring path: rank %d: %s\n", rank_,
                   r, blobs[r].substr(1).c_str());
      ring_boot_.reset();
    }
  return {};
}

// Step 8: Rina mode's communicators (rina_job.h), over the job's
// bootstrap, with a connect_timeout_ms of their own; then every rank
// learns whether every rank made its parts, and all fail together.
Error JobSetup::rina() {
  if (!rina_mode_) return {};
  if (loc_.local_size > 1)
    return Error::make(ErrorCode::invalid_argument,
                       "rina: local ranks (" + std::to_string(loc_.local_size) +
                           " per host) are not supported in Rina mode");
  if (rank_ == 0 && fabric_racks_.empty())
    std::fprintf(stderr,
                 "netreduce: rank 0: Rina mode, but the daemon named no racks of a fabric: no "
                 "rack has a box, every all-reduce runs on rings\n");
  const RinaJobInput in{static_cast<unsigned>(rank_),
                        racks_,
                        loc_.ring,
                        fabric_racks_,
                        device_,
                        gid_index_,
                        job_key_};
  const auto until = Clock::now() + std::chrono::milliseconds(options_.connect_timeout_ms);
  const Error mine = make_rina_job(in, *boot_, options_, until, rina_);
  std::vector<std::string> blobs;
  if (Error e = boot_->allgather(mine.ok() ? "1" : "0" + mine.message, blobs,
                                 until + std::chrono::milliseconds(options_.connect_timeout_ms)))
    return e;
  for (int r = 0; r < world_; ++r)
    if (blobs[r] != "1")
      return Error::make(mine.ok() ? ErrorCode::bootstrap : mine.code,
                         "rank " + std::to_string(r) + ": " + blobs[r].substr(1));
  return {};
}

// The communicator of what the steps made.
std::unique_ptr<Communicator> JobSetup::communicator() {
  const unsigned n = loc_.local_size;
  auto impl = std::make_unique<Communicator::Impl>(std::move(t_), std::move(coll_), options_);
  impl->owned_rings = std::move(owned_);
  impl->links = links_;
  impl->ring_in_rank_order = loc_.rank_order;
  impl->rina = std::move(rina_);
  if (n > 1 || !loc_.rank_order) {  // the transport's rank is the ring's place
    impl->local = std::move(local_);
    impl->global_rank = rank_;
    impl->global_world = world_;
    impl->host = loc_.host;
  }
  std::shared_ptr<Bootstrap> b = std::move(boot_);
  // Failover (docs/design.md#failover) agrees among the ring's members, in
  // ring order: the job's bootstrap (its blobs put in ring order), or the
  // ring's own with local ranks.
  if (impl->collective->path() == Path::ina && (n == 1 || ring_boot_)) {
    impl->collective->set_exchange(
        [x = n > 1 ? ring_boot_ : b, ring = n > 1 ? std::vector<unsigned>{} : loc_.ring](
            const std::string& mine, std::vector<std::string>& all, Clock::time_point dl) {
          if (ring.empty()) return x->allgather(mine, all, dl);
          std::vector<std::string> by_rank;
          if (Error e = x->allgather(mine, by_rank, dl)) return e;
          all.clear();
          for (unsigned g : ring) all.push_back(std::move(by_rank[g]));
          return Error{};
        });
    impl->collective->set_failback(
        options_.failback_calls,
        [target = daemon_target(options_), ids = cc_.ring_ids, ms = options_.daemon_timeout_ms] {
          return rings_not_ready(target, ids, ms);
        });
  }
  impl->close_barrier = [b, ms = std::max(options_.op_timeout_ms, 1000)] {
    std::vector<std::string> all;
    (void)b->allgather("", all, Clock::now() + std::chrono::milliseconds(ms));
  };
  return std::make_unique<Communicator>(std::move(impl));
}

// Steps 1-8 on a job whose device and bootstrap are open.
Error run_steps(JobSetup& job, std::unique_ptr<Communicator>& out) {
  if (Error e = job.job_header()) return e;
  if (Error e = job.locality()) return e;
  if (Error e = job.connect_qps()) return e;
  if (Error e = job.decide_path()) return e;
  if (Error e = job.probe()) return e;
  if (Error e = job.share_links()) return e;
  if (Error e = job.join_ring_bootstrap()) return e;
  if (Error e = job.rina()) return e;
  out = job.communicator();
  return {};
}

}  // namespace
}  // namespace host

Error Communicator::create(int rank, int world, const std::string& device, int gid_index,
                           const std::string& bootstrap, const Options& options,
                           std::unique_ptr<Communicator>& out) {
  using namespace host;
  out.reset();
  if (Error e = check_arguments(rank, world, bootstrap, options)) return e;
  JobSetup job(rank, world, bootstrap, options);
  if (Error e = job.open(device, gid_index)) return e;
  return run_steps(job, out);
}

Error Communicator::create(int rank, int world, const std::string& device, int gid_index,
                           const Rendezvous& rendezvous, const Options& options,
                           std::unique_ptr<Communicator>& out) {
  using namespace host;
  out.reset();
  if (!rendezvous.allgather)
    return Error::make(ErrorCode::invalid_argument, "rendezvous: no allgather");
  if (Error e = check_arguments(rank, world, options)) return e;
  JobSetup job(rank, world, rendezvous.name, options);
  if (Error e = job.open_over(device, gid_index, rendezvous)) return e;
  return run_steps(job, out);
}

namespace host {

Error create_on_bootstrap(unsigned rank, unsigned world, const std::string& device, int gid_index,
                          std::unique_ptr<Bootstrap> boot, const std::string& address,
                          const Options& options, std::unique_ptr<Communicator>& out) {
  out.reset();
  if (Error e = check_arguments(static_cast<int>(rank), static_cast<int>(world), address, options))
    return e;
  JobSetup job(static_cast<int>(rank), static_cast<int>(world), address, options, /*part=*/true);
  if (Error e = job.adopt(device, gid_index, std::move(boot))) return e;
  return run_steps(job, out);
}

}  // namespace host
}  // namespace netreduce
