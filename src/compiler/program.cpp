// Program construction (memory planning) and execution.
//
// Memory plan: every computed value gets a place. Batch inputs, state and constants live in
// their own buffers; step outputs are written straight into per-execution output buffers; a
// state's new value is computed directly into the state buffer when no later op reads the old
// value (otherwise it is copied in at the end); reshapes alias their input; everything else
// shares one arena, packed greedily by size over liveness intervals (values whose lifetimes
// do not overlap reuse the same bytes). The arena is allocated once per program.
#include "compiler/program.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <unordered_map>

#include "ir/fused.h"

namespace cstorch::compiler {

namespace {
constexpr size_t kAlign = 64;
// The kernel of a packed upload's step (Program::plan): the host value into its place in the
// upload block (ctx.workspace), which upload_pack copies to the device.
void copy_into_pack(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in, void*) {
  std::memcpy(ctx.workspace, in[0], n.nbytes());
}

// "; inputs 'wte.weight' f32[200, 32], i32[4, 32]": an op's inputs in a run-time error, a state
// tensor (a parameter, an optimizer state) by its name, so that an index out of range names the
// table it indexes (a model whose vocabulary is smaller than its data's).
std::string describe_inputs(const Graph& g, const ir::Node& n) {
  std::string s;
  for (const auto& in : n.inputs) {
    if (!in) continue;
    std::string name;
    for (const auto& slot : g.state)
      if (slot.input == in && slot.impl && !slot.impl->name.empty())
        name = "'" + slot.impl->name + "' ";
    s += fmt::format("{}{}{}{}", s.empty() ? "; inputs " : ", ", name, dtype_name(in->dtype),
                     shape_str(in->shape));
  }
  return s;
}

size_t align_up(size_t n) {
  return (n + kAlign - 1) / kAlign * kAlign;
}

double node_flops(const ir::Node& n) {
  if (n.op == ir::OpCode::Matmul) {
    const auto& a = n.attr<ir::MatmulAttrs>();
    const auto& s = n.inputs[0]->shape;
    int64_t k = a.trans_a ? s[s.size() - 2] : s.back();
    return 2.0 * static_cast<double>(n.numel()) * static_cast<double>(k);
  }
  if (n.op == ir::OpCode::Gemm) {
    const auto& a = n.attr<ir::GemmAttrs>();
    const auto& s = n.inputs[0]->shape;
    int64_t k = a.trans_a ? s[s.size() - 2] : s.back();
    return 2.0 * static_cast<double>(n.numel()) * static_cast<double>(k);
  }
  if (n.op == ir::OpCode::Linear)
    return 2.0 * static_cast<double>(n.numel()) * static_cast<double>(n.inputs[0]->shape.back());
  return static_cast<double>(n.numel());
}
}  // namespace

Program::Program(Graph g, Device device, ProgramStats traced)
    : g_(std::move(g)), device_(device), stats_(traced) {
  plan();
  plan_groups();
  const char* p = std::getenv("CSTORCH_PROFILE");
  profile_ = p && *p && std::string(p) != "0";
  profile_nodes_ = profile_ && std::string(p) == "nodes";
  step_seconds_.assign(steps_.size(), 0.0);
  if (profile_) {
    recorder_ = nullptr;  // kernels are timed one by one
    if (const ir::DeviceBackend* dev = ir::find_device_backend(device_))
      clock_ = dev->kernel_clock();
  }
}

Program::~Program() {
  if (!profile_ || runs_ == 0) return;
  const int64_t counted = runs_ > 1 ? runs_ - 1 : runs_;  // see execute(): the first is left out
  std::map<std::string, std::pair<double, int>> by_op;
  double total = 0;
  for (size_t i = 0; i < steps_.size(); ++i) {
    auto& e = by_op[steps_[i].node->name()];
    e.first += step_seconds_[i];
    e.second++;
    total += step_seconds_[i];
  }
  std::vector<std::pair<double, std::string>> rows;
  for (auto& [k, v] : by_op) rows.push_back({v.first, k});
  std::sort(rows.rbegin(), rows.rend());
  fmt::print(
      stderr, "cstorch profile: {} executions{}, {:.1f} us of kernels per execution{}\n", counted,
      runs_ > 1 ? " after the first" : "", 1e6 * total / counted,
      clock_ ? fmt::format(" ({}'s clock, kernels not waited for one by one)", device_str(device_))
             : "");
  for (auto& [sec, name] : rows)
    fmt::print(stderr, "  {:<16} {:>5} calls {:>9.1f} us/exec {:>5.1f}%\n", name,
               by_op[name].second, 1e6 * sec / counted, 100 * sec / total);
  if (!profile_nodes_) return;
  // CSTORCH_PROFILE=nodes: every kernel call in execution order, with its shapes. A group run
  // as one pass has its time on its first node; the others say so.
  int64_t group_first = -1;
  size_t group_end = 0;
  for (size_t i = 0; i < steps_.size(); ++i) {
    const ir::Node& n = *steps_[i].node;
    if (group_at_[i] >= 0) {
      group_first = n.id;
      group_end = i + groups_[group_at_[i]].count;
    }
    std::string ins;
    for (const auto& x : n.inputs) ins += (ins.empty() ? "" : ", ") + shape_str(x->shape);
    const std::string with =
        i < group_end && group_at_[i] < 0 ? fmt::format(" (one pass with %{})", group_first) : "";
    fmt::print(stderr, "  %{:<5} {:<16} {:>9.1f} us/exec  {} <- ({}) {}{}\n", n.id, n.name(),
               1e6 * step_seconds_[i] / counted, shape_str(n.shape), ins, attrs_str(n), with);
  }
}

void Program::plan() {
  // Recording (DeviceBackend::records). The kernels of the step's device make the recorded
  // body; kernels elsewhere (host scalars such as an optimizer's step count, transfers) run
  // outside it: before each replay those that need nothing the body computes (the prologue:
  // host arithmetic, uploads of host values), after it those that read its results (the
  // epilogue: downloads, host arithmetic on them). A program records when every node fits one
  // of the three, no body kernel reads an epilogue value, and no node is a collective (it waits
  // for the host in the middle of the step). The nodes are then ordered prologue, body,
  // epilogue (each in its original order: still a topological order).
  recorder_ = nullptr;
  prologue_ = epilogue_ = 0;
  {
    const ir::DeviceBackend* dev = ir::find_device_backend(device_);
    std::unordered_map<const ir::Node*, int> phase;  // 0 leaf, 1 prologue, 2 body, 3 epilogue
    bool ok = dev && dev->records(), body = false;
    for (const auto& np : g_.nodes) {
      if (!ok) break;
      const auto& node = *np;
      int in = 0;
      for (const auto& x : node.inputs) in = std::max(in, phase.at(x.get()));
      int ph;
      if (node.op == ir::OpCode::Input || node.op == ir::OpCode::Constant) {
        ph = 0;
      } else if (has_trait(node.op, ir::kAlias)) {
        ph = in;
      } else if (has_trait(node.op, ir::kCollective)) {
        ok = false;
        ph = 3;
      } else if (node.op != ir::OpCode::ToDevice && &ir::device_backend(node.device) == dev) {
        ok = in < 3;
        ph = 2;
        body = true;
      } else {
        ph = in >= 2 ? 3 : 1;
      }
      phase[np.get()] = ph;
    }
    if (ok && body) {
      recorder_ = dev;
      std::stable_sort(g_.nodes.begin(), g_.nodes.end(),
                       [&](const ir::NodePtr& x, const ir::NodePtr& y) {
                         return phase.at(x.get()) < phase.at(y.get());
                       });
      for (const auto& np : g_.nodes) phase_.push_back(static_cast<uint8_t>(phase.at(np.get())));
    }
  }
  const size_t n = g_.nodes.size();
  std::unordered_map<const ir::Node*, uint32_t> id;
  for (size_t i = 0; i < n; ++i) id[g_.nodes[i].get()] = static_cast<uint32_t>(i);
  places_.assign(n, ValuePlace{});
  std::vector<bool> placed(n, false);
  std::vector<uint32_t> root(n);
  std::vector<bool> is_alias(n, false);

  // Leaves and aliases.
  for (size_t i = 0; i < n; ++i) {
    const auto& node = *g_.nodes[i];
    root[i] = static_cast<uint32_t>(i);
    if (node.op == ir::OpCode::Input) {
      const auto& a = node.attr<ir::InputAttrs>();
      places_[i] = {a.kind == ir::InputKind::Batch ? Loc::Batch : Loc::State, a.index, nullptr};
      placed[i] = true;
    } else if (node.op == ir::OpCode::Constant) {
      places_[i] = {Loc::Constant, 0, node.buffer->data};
      if (node.buffer->device != node.device) {
        // A constant read on another device than it was made on: upload it once.
        auto up = ir::Buffer::alloc(node.nbytes(), node.device);
        ir::copy_between(node.device, up->data, node.buffer->device, node.buffer->data,
                         node.nbytes());
        places_[i].constant = up->data;
        uploaded_.push_back(std::move(up));
      }
      placed[i] = true;
    } else if (has_trait(node.op, ir::kAlias)) {
      is_alias[i] = true;
      root[i] = root[id.at(node.inputs[0].get())];
      placed[i] = true;
    }
  }

  // Last use of every root value (uses through aliases count); `end` = read by final copies.
  const size_t end = n;
  std::vector<size_t> last(n, 0);
  for (size_t i = 0; i < n; ++i) {
    last[i] = std::max(last[i], i);
    for (auto& in : g_.nodes[i]->inputs) {
      uint32_t r = root[id.at(in.get())];
      last[r] = std::max(last[r], i);
    }
  }

  struct FinalCopy {
    uint32_t src;
    Loc loc;
    int64_t index;
  };
  std::vector<FinalCopy> finals;

  // Step outputs: computed straight into the output buffer when possible. A recorded program's
  // kernels write only buffers of its own (the output buffers change from call to call), so
  // its outputs are copied out after the last kernel.
  for (size_t o = 0; o < g_.outputs.size(); ++o) {
    uint32_t v = id.at(g_.outputs[o].get());
    if (!placed[v] && !recorder_) {
      places_[v] = {Loc::Output, static_cast<int64_t>(o), nullptr};
      placed[v] = true;
    } else {
      finals.push_back({v, Loc::Output, static_cast<int64_t>(o)});
      last[root[v]] = end;
    }
  }
  // State writes: in place when the old value is dead by then.
  for (size_t s = 0; s < g_.state.size(); ++s) {
    auto& slot = g_.state[s];
    stats_.state_bytes += static_cast<size_t>(numel(slot.shape)) * itemsize(slot.dtype);
    if (!slot.write) continue;
    uint32_t w = id.at(slot.write.get());
    bool ok = !placed[w];
    if (ok && slot.input) {
      uint32_t r = id.at(slot.input.get());
      size_t lu = last[r];
      if (lu > w) ok = false;
      if (ok && lu == w) {
        // W reads the old value itself: safe only element for element: an elementwise op, or
        // a Gemm reading it only as its addend (the kernel reads each addend element just
        // before writing that element, and never stores partial sums when it has an addend).
        const bool gemm_addend =
            slot.write->op == ir::OpCode::Gemm && slot.write->attr<ir::GemmAttrs>().addend;
        ok = has_trait(slot.write->op, ir::kElementwise) || gemm_addend;
        const auto& ins = slot.write->inputs;
        for (size_t i = 0; i < ins.size(); ++i) {
          if (root[id.at(ins[i].get())] != r) continue;
          if (ins[i]->numel() != slot.write->numel()) ok = false;
          if (gemm_addend && i != slot.write->attr<ir::GemmAttrs>().addend_index())
            ok = false;  // read as A, B or another operand: not in place
        }
      }
    }
    if (ok) {
      places_[w] = {Loc::State, static_cast<int64_t>(s), nullptr};
      placed[w] = true;
      stats_.inplace_state_writes++;
    } else if (slot.input && root[w] == id.at(slot.input.get())) {
      // The new value is an alias of the old storage (After: a Gemm updated it in place):
      // nothing to place or copy.
      last[root[w]] = end;
      stats_.inplace_state_writes++;
    } else {
      finals.push_back({w, Loc::State, static_cast<int64_t>(s)});
      last[root[w]] = end;
      stats_.copied_state_writes++;
    }
  }
  // Old state values read by final copies must not be overwritten in place: handled above by
  // `last` (a final copy of an Input(State) value extends its life to `end`).

  // The upload block. A recorded program's prologue uploads the host values its recorded kernels
  // read: an optimizer's step sizes, a few per parameter, hundreds a step. One transfer each
  // waits for a staging slot and a copy each, with the device idle meanwhile; instead, each
  // small upload (read only by recorded or later kernels) writes its value into a host block
  // and one transfer after the prologue copies the block to the device.
  std::vector<int64_t> packed_at(n, -1);
  if (recorder_) {
    std::vector<uint8_t> first_reader(n, 4);  // the earliest phase that reads each value
    for (size_t i = 0; i < n; ++i)
      for (auto& in : g_.nodes[i]->inputs) {
        const uint32_t u = id.at(in.get());
        first_reader[u] = std::min(first_reader[u], phase_[i]);
      }
    for (size_t i = 0; i < n; ++i) {
      const auto& node = *g_.nodes[i];
      if (node.op != ir::OpCode::ToDevice || placed[i] || phase_[i] != 1 || first_reader[i] < 2 ||
          node.nbytes() > kPackedUploadBytes || &ir::device_backend(node.device) != recorder_ ||
          !ir::device_backend(node.inputs[0]->device).host_accessible())
        continue;
      packed_at[i] = static_cast<int64_t>(pack_bytes_);
      places_[i] = {Loc::Packed, packed_at[i], nullptr};
      placed[i] = true;
      pack_bytes_ += align_up(node.nbytes());
    }
    if (pack_bytes_) {
      pack_host_ = ir::Buffer::alloc(pack_bytes_);
      pack_device_ = ir::Buffer::alloc(pack_bytes_, device_);  // the recorder's device
    }
  }

  // Kernels and their workspaces (scratch live only during the node's own step).
  struct Item {
    uint32_t v;  // value id, or n + step index for a workspace
    size_t size;
    size_t first, last;
    uint32_t arena;
    size_t offset;
  };
  std::vector<Item> items;
  auto arena_of = [&](Device d) {
    for (size_t a = 0; a < arena_devices_.size(); ++a)
      if (arena_devices_[a] == d) return static_cast<uint32_t>(a);
    arena_devices_.push_back(d);
    return static_cast<uint32_t>(arena_devices_.size() - 1);
  };
  size_t max_in = 1;
  for (size_t i = 0; i < n; ++i) {
    const auto& node = *g_.nodes[i];
    if (node.op == ir::OpCode::Input || node.op == ir::OpCode::Constant || is_alias[i]) continue;
    const ir::Kernel k = ir::kernel_for(node);  // error names the op and the device
    const auto& backend = ir::device_backend(node.device);
    Step st{k,
            &node,
            static_cast<uint32_t>(input_ids_.size()),
            static_cast<uint32_t>(node.inputs.size()),
            static_cast<uint32_t>(i),
            {},
            -1};
    st.ctx.backend = &backend;
    st.ctx.stream = backend.stream();
    if (packed_at[i] >= 0) {  // a host copy into the upload block
      st.kernel = &copy_into_pack;
      st.ctx = {};
      st.ctx.workspace = static_cast<char*>(pack_host_->data) + packed_at[i];
    }
    if (node.op != ir::OpCode::ToDevice) {
      if (size_t ws = backend.workspace_bytes(node)) {
        st.ctx.workspace_bytes = ws;
        items.push_back({static_cast<uint32_t>(n + steps_.size()), align_up(ws), i, i,
                         arena_of(node.device), 0});
      }
    }
    for (auto& in : node.inputs) input_ids_.push_back(id.at(in.get()));
    max_in = std::max(max_in, node.inputs.size());
    if (recorder_ && phase_[i] <= 1) prologue_ = steps_.size() + 1;  // they come first
    if (recorder_ && phase_[i] <= 2) epilogue_ = steps_.size() + 1;  // the body follows
    steps_.push_back(st);
    stats_.flops += node_flops(node);
  }

  // Results written over their input 0 (kInPlaceInput0): an arena value v whose input 0 is an
  // arena value u of the same size and device, read last by v and by no other input of v,
  // takes u's bytes (owner[v] = owner[u]); the owner's interval then runs to v's last use.
  std::vector<uint32_t> owner(n);
  std::vector<size_t> owner_last(last);
  for (size_t i = 0; i < n; ++i) {
    owner[i] = static_cast<uint32_t>(i);
    const auto& node = *g_.nodes[i];
    if (placed[i] || !has_trait(node.op, ir::kInPlaceInput0) || node.inputs.empty()) continue;
    const uint32_t u = id.at(node.inputs[0].get());
    if (placed[u] || last[u] != i || node.inputs[0]->nbytes() != node.nbytes() ||
        node.inputs[0]->device != node.device)
      continue;
    bool shared = false;
    for (size_t k = 1; k < node.inputs.size(); ++k)
      shared = shared || root[id.at(node.inputs[k].get())] == u;
    if (shared) continue;
    owner[i] = owner[u];
    owner_last[owner[i]] = std::max(owner_last[owner[i]], last[i]);
    stats_.inplace_results++;
  }
  // Arenas: greedy by size over liveness intervals, one per device.
  for (size_t i = 0; i < n; ++i) {
    if (placed[i] || owner[i] != i) continue;
    size_t sz = align_up(g_.nodes[i]->nbytes());
    items.push_back(
        {static_cast<uint32_t>(i), sz, i, owner_last[i], arena_of(g_.nodes[i]->device), 0});
    stats_.naive_bytes += sz;
  }
  std::vector<size_t> order(items.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return items[a].size > items[b].size; });
  std::vector<size_t> done;
  std::vector<size_t> arena_size(arena_devices_.size(), 0);
  for (size_t k : order) {
    auto& it = items[k];
    // Collect conflicting ranges, sorted by offset; take the lowest gap that fits.
    std::vector<std::pair<size_t, size_t>> busy;
    for (size_t d : done) {
      const auto& o = items[d];
      if (o.arena == it.arena && o.first <= it.last && it.first <= o.last)
        busy.push_back({o.offset, o.offset + o.size});
    }
    std::sort(busy.begin(), busy.end());
    size_t off = 0;
    for (auto& [b, e] : busy) {
      if (off + it.size <= b) break;
      off = std::max(off, e);
    }
    it.offset = off;
    arena_size[it.arena] = std::max(arena_size[it.arena], off + it.size);
    done.push_back(k);
    if (it.v < n)
      places_[it.v] = {Loc::Arena, static_cast<int64_t>(off), nullptr, it.arena};
    else
      steps_[it.v - n].workspace_offset = static_cast<int64_t>(off);
  }
  for (size_t i = 0; i < n; ++i)
    if (!placed[i] && owner[i] != i) places_[i] = places_[owner[i]];
  stats_.arena_bytes = 0;
  for (size_t a = 0; a < arena_devices_.size(); ++a) {
    stats_.arena_bytes += arena_size[a];
    arenas_.push_back(ir::Buffer::alloc(std::max<size_t>(arena_size[a], 1), arena_devices_[a]));
  }
  for (auto& st : steps_)
    if (st.workspace_offset >= 0) {
      uint32_t a = arena_of(st.node->device);
      st.ctx.workspace = static_cast<char*>(arenas_[a]->data) + st.workspace_offset;
    }

  // Collectives: a host-side request handle per all_reduce_start, shared with its unpacks; on
  // a device the host cannot read, a host buffer the bucket is reduced through.
  {
    std::unordered_map<const ir::Node*, size_t> slot;
    std::unordered_map<const ir::Node*, void*> staging;
    for (auto& st : steps_)
      if (st.node->op == ir::OpCode::AllReduceStart) slot[st.node] = slot.size();
    requests_.assign(slot.size(), 0);
    for (auto& st : steps_) {
      const ir::Node* start = st.node->op == ir::OpCode::AllReduceStart ? st.node
                              : st.node->op == ir::OpCode::AllReduceUnpack
                                  ? st.node->inputs[0].get()
                                  : nullptr;
      if (!start) continue;
      st.ctx.request = &requests_[slot.at(start)];
      if (!ir::device_backend(start->device).host_accessible()) {
        auto [it, fresh] = staging.try_emplace(start, nullptr);
        if (fresh) {
          host_staging_.push_back(ir::Buffer::alloc(start->nbytes()));
          it->second = host_staging_.back()->data;
        }
        st.ctx.host_staging = it->second;
      }
    }
  }

  // Batch inputs read on the step's device; one living elsewhere is copied into a staging
  // buffer there first.
  staging_.assign(g_.batch_inputs.size(), nullptr);
  host_batch_ = std::vector<ir::Buffer>(g_.batch_inputs.size());
  for (auto& b : host_batch_) b.owned = false;
  for (auto& b : host_batch_) host_batch_ptrs_.push_back(&b);

  stats_.nodes_compiled = steps_.size() + finals.size();
  in_scratch_.assign(max_in, nullptr);
  ptrs_.assign(n + 1, nullptr);
  for (size_t i = 0; i < n; ++i) {
    if (places_[i].loc == Loc::Arena && !is_alias[i])
      ptrs_[i] = static_cast<char*>(arenas_[places_[i].arena]->data) + places_[i].index;
    if (places_[i].loc == Loc::Constant) ptrs_[i] = const_cast<void*>(places_[i].constant);
    if (places_[i].loc == Loc::Packed)
      ptrs_[i] = static_cast<char*>(pack_device_->data) + places_[i].index;
  }
  alias_ids_.clear();
  for (size_t i = 0; i < n; ++i)
    if (is_alias[i])
      alias_ids_.push_back({static_cast<uint32_t>(i), id.at(g_.nodes[i]->inputs[0].get())});
  for (size_t i = 0; i < n; ++i) {
    if (is_alias[i]) continue;
    if (places_[i].loc == Loc::Batch)
      batch_ids_.push_back({static_cast<uint32_t>(i), static_cast<uint32_t>(places_[i].index)});
    if (places_[i].loc == Loc::State)
      state_ids_.push_back({static_cast<uint32_t>(i), static_cast<uint32_t>(places_[i].index)});
    if (places_[i].loc == Loc::Output)
      output_ids_.push_back({static_cast<uint32_t>(i), static_cast<uint32_t>(places_[i].index)});
  }
  for (auto& f : finals) {
    if (f.loc == Loc::Output)
      final_outputs_.push_back({f.src, static_cast<uint32_t>(f.index)});
    else
      state_copies_.push_back({f.src, static_cast<uint32_t>(f.index)});
  }
  state_ptrs_.assign(g_.state.size(), nullptr);
  for (size_t s = 0; s < g_.state.size(); ++s) {
    const auto& slot = g_.state[s];
    if (slot.cast_of < 0) continue;
    Derived d{static_cast<uint32_t>(s),
              static_cast<uint32_t>(slot.cast_of),
              ir::kernel_for(*slot.refresh),
              {},
              0};
    d.ctx.backend = &ir::device_backend(slot.device);
    d.ctx.stream = d.ctx.backend->stream();
    derived_.push_back(d);
  }

  // The values the recorded kernels read and write (a recording is replayed while their
  // pointers are unchanged), and the batch inputs they read: those are always staged, since
  // the batch's own buffer changes from call to call.
  recorded_values_.clear();
  stage_always_.assign(g_.batch_inputs.size(), false);
  if (recorder_) {
    std::vector<bool> seen(n + 1, false);
    auto add = [&](uint32_t v) {
      if (!seen[v]) recorded_values_.push_back(v);
      seen[v] = true;
    };
    for (size_t si = prologue_; si < epilogue_; ++si) {
      const Step& st = steps_[si];
      for (uint32_t j = 0; j < st.num_inputs; ++j) add(input_ids_[st.first_input + j]);
      add(st.out);
    }
    // (An alias reads its root's buffer.)
    std::vector<bool> root_read(n + 1, false);
    for (uint32_t v : recorded_values_) root_read[root[v]] = true;
    for (auto& [v, b] : batch_ids_)
      if (root_read[v]) stage_always_[b] = true;
  }
}

bool Program::same_bindings() const {
  if (recorded_ptrs_.size() != recorded_values_.size()) return false;
  for (size_t k = 0; k < recorded_values_.size(); ++k)
    if (ptrs_[recorded_values_[k]] != recorded_ptrs_[k]) return false;
  return true;
}

// Groups: runs of consecutive Fused steps of one output shape, of at least
// ir::kMinFusedGroupElements elements, on a backend with a group kernel, that write at least one
// state (the optimizer's updates of one parameter: AdamW's two moments, then the parameter;
// Adadelta's square average, its step, the delta average and the parameter). Run as one pass,
// each state is read and written once per step instead of once per node that touches it; a
// member's arena result (Adadelta's step) is still written, but read back from L1. Whether the
// buffers allow it (group_safe) is checked at every execution: state and batch buffers are bound
// then.
void Program::plan_groups() {
  group_at_.assign(steps_.size(), -1);
  const char* env = std::getenv("CSTORCH_FUSED_GROUPS");  // "0": every node on its own
  if (env && std::string(env) == "0") return;
  auto member = [&](const Step& st) {
    const ir::Node& n = *st.node;
    const Loc loc = places_[st.out].loc;
    return n.op == ir::OpCode::Fused && (n.dtype == DType::f32 || n.dtype == DType::bf16) &&
           (loc == Loc::State || loc == Loc::Arena) && n.numel() >= ir::kMinFusedGroupElements;
  };
  for (size_t s = 0; s < steps_.size();) {
    const ir::Node& head = *steps_[s].node;
    ir::FusedGroupKernel k =
        member(steps_[s]) ? ir::device_backend(head.device).fused_group_kernel() : nullptr;
    if (!k) {
      ++s;
      continue;
    }
    size_t e = s;
    int regs = 0;
    bool writes_state = false;
    while (e < steps_.size() && e - s < static_cast<size_t>(ir::kMaxFusedGroup)) {
      const ir::Node& n = *steps_[e].node;
      if (!member(steps_[e]) || n.device != head.device || n.shape != head.shape) break;
      const int r = static_cast<int>(n.inputs.size() + n.attr<ir::FusedAttrs>().code.size());
      if (regs + r > ir::kMaxFusedGroupRegs) break;
      regs += r;
      writes_state = writes_state || places_[steps_[e].out].loc == Loc::State;
      ++e;
    }
    if (e - s >= 2 && writes_state) {
      in_scratch_.resize(std::max<size_t>(in_scratch_.size(), ir::kMaxFusedGroupRegs));
      group_at_[s] = static_cast<int32_t>(groups_.size());
      groups_.push_back({static_cast<uint32_t>(s), static_cast<uint32_t>(e - s), k});
      stats_.fused_groups++;
      stats_.fused_grouped += e - s;
      s = e;
    } else {
      ++s;
    }
  }
}

bool interleave_safe(const GroupAccess* a, size_t n) {
  for (size_t w = 0; w < n; ++w) {
    if (!a[w].write) continue;
    const char* wb = static_cast<const char*>(a[w].begin);
    for (size_t x = 0; x < n; ++x) {
      if (x == w) continue;
      const char* xb = static_cast<const char*>(a[x].begin);
      if (!(xb < wb + a[w].bytes && wb < xb + a[x].bytes)) continue;
      if (a[x].write || xb != wb || a[x].bytes != a[w].bytes || !a[x].f32) return false;
    }
  }
  return true;
}

// The group kernel interleaves the nodes block by block, so a buffer that one member writes
// may be read by the members only element for element. Any other overlap (two state slots
// sharing storage, a batch input that is a state's storage) runs the nodes one by one.
bool Program::group_safe(const Group& g) const {
  GroupAccess acc[ir::kMaxFusedGroup + ir::kMaxFusedGroupRegs];
  size_t n = 0;
  for (uint32_t k = g.first; k < g.first + g.count; ++k) {
    const Step& st = steps_[k];
    acc[n++] = {ptrs_[st.out], st.node->nbytes(), true, st.node->dtype == DType::f32};
    for (uint32_t j = 0; j < st.num_inputs; ++j) {
      const ir::Node& x = *st.node->inputs[j];
      acc[n++] = {ptrs_[input_ids_[st.first_input + j]], x.nbytes(), false, x.dtype == DType::f32};
    }
  }
  return interleave_safe(acc, n);
}

void Program::run(const void* const* batch, void* const* outputs) {
  for (size_t i = 0; i < host_batch_.size(); ++i) {
    host_batch_[i].data = const_cast<void*>(batch[i]);
    host_batch_[i].nbytes = g_.batch_inputs[i]->nbytes();
  }
  run(host_batch_ptrs_.data(), outputs);
}

void Program::run(const ir::Buffer* const* batch, void* const* outputs) {
  // Bind this execution's buffers.
  for (size_t s = 0; s < g_.state.size(); ++s) {
    const auto& slot = g_.state[s];
    const auto& node = slot.impl->node;
    CS_CHECK(node->buffer != nullptr,
             "state tensor {} '{}' (op '{}') has no value to read; it was replaced by a tensor "
             "that is not materialised",
             s, slot.impl->name, node->name());
    if (node->shape != slot.shape || node->dtype != slot.dtype)
      fail(
          "state tensor {}'{}' is {}{} but the step was compiled for {}{}; reassigning a "
          "parameter or buffer with another shape or dtype needs a new trace",
          s, slot.impl->name, dtype_name(node->dtype), shape_str(node->shape),
          dtype_name(slot.dtype), shape_str(slot.shape));
    if (node->buffer->device != slot.device)
      fail(
          "state tensor {} '{}' is on device {} but the step was compiled for it on {}; moving "
          "a parameter or buffer to another device needs a new trace",
          s, slot.impl->name, device_str(node->buffer->device), device_str(slot.device));
    state_ptrs_[s] = node->buffer->data;
  }
  for (auto& [v, b] : batch_ids_) {
    const ir::Buffer& in = *batch[b];
    const Device want = g_.nodes[v]->device;
    // (A batch read by recorded kernels is read from the program's staging buffer: the batch's
    // own buffer changes from call to call.)
    if (in.device == want && !stage_always_[b]) {
      ptrs_[v] = in.data;
      continue;
    }
    // The batch lives elsewhere (a host batch for a device step): stage it. The buffer is the
    // program's, made at the first execution, so steady-state steps do not allocate.
    auto& st = staging_[b];
    if (!st) st = ir::Buffer::alloc(g_.nodes[v]->nbytes(), want);
    ir::copy_between(want, st->data, in.device, in.data, g_.nodes[v]->nbytes());
    ptrs_[v] = st->data;
  }
  for (auto& [v, s] : state_ids_) ptrs_[v] = state_ptrs_[s];
  for (auto& [v, o] : output_ids_) ptrs_[v] = outputs[o];
  for (auto& [v, src] : alias_ids_) ptrs_[v] = ptrs_[src];

  refresh_derived();

  // The profile leaves out the first execution: its kernels pay one-time costs (a library's
  // choice of algorithm per shape, a device's loading of kernel code) that later steps do not.
  if (profile_ && runs_ == 1) std::fill(step_seconds_.begin(), step_seconds_.end(), 0.0);
  ++runs_;
  if (!recorder_) {
    if (clock_) {
      clocked_.clear();
      clock_->start();
    }
    run_steps(0, prologue_);
    upload_pack();
    run_steps(prologue_, steps_.size());
    if (clock_) {
      // The device's times of its kernels; a kernel of another device (host arithmetic) was
      // timed on the host.
      const std::vector<double> sec = clock_->seconds();
      for (size_t i = 0; i < clocked_.size() && i < sec.size(); ++i)
        step_seconds_[clocked_[i]] += sec[i];
    }
  } else {
    run_steps(0, prologue_);
    upload_pack();
    if (recording_ && same_bindings())
      recorder_->replay(*recording_);
    else if (runs_ > kDirectRuns && recordings_ < kMaxRecordings)
      record_and_replay();
    else
      run_steps(prologue_, epilogue_);
    run_steps(epilogue_, steps_.size());
  }
  for (auto& [v, o] : final_outputs_) {
    const Device d = g_.nodes[v]->device;
    ir::copy_between(d, outputs[o], d, ptrs_[v], g_.nodes[v]->nbytes());
  }
  for (auto& [v, s] : state_copies_) {
    if (ptrs_[v] != state_ptrs_[s])
      ir::copy_between(g_.state[s].device, state_ptrs_[s], g_.nodes[v]->device, ptrs_[v],
                       g_.nodes[v]->nbytes());
  }
  note_state_written();
}

// The prologue's packed uploads, gathered in the host block by their steps: one transfer.
void Program::upload_pack() {
  if (pack_bytes_)
    ir::copy_between(pack_device_->device, pack_device_->data, Device{}, pack_host_->data,
                     pack_bytes_);
}

// A derived slot whose source changed since this program last wrote both (or that was never
// written: versions start at 1) is computed again from the source, before any kernel reads it.
// The states this execution writes count as changed from here on, so that an execution that
// fails part way leaves every copy made from them (here and in other programs) to be computed
// again.
void Program::refresh_derived() {
  for (auto& d : derived_) {
    if (g_.state[d.of].impl->node->buffer->version != d.seen) {
      const void* in[1] = {state_ptrs_[d.of]};
      d.kernel(d.ctx, *g_.state[d.slot].refresh, in, state_ptrs_[d.slot]);
    }
    d.seen = 0;
  }
  mark_states_written();
}

void Program::mark_states_written() {
  for (const auto& slot : g_.state)
    if (slot.write) slot.impl->node->buffer->mark_written();
}

// Every state this execution wrote has new contents; the derived slots were written from their
// sources' new values, so they match those versions.
void Program::note_state_written() {
  mark_states_written();
  for (auto& d : derived_) d.seen = g_.state[d.of].impl->node->buffer->version;
}

// Runs step si's kernel call; with the profile on, adds its time to step_seconds_[si]. A kernel
// of the program's device, when that device has a clock, is timed there (a mark after the
// call, read at the end of the execution). Otherwise the host's clock times it, and a device
// that runs kernels asynchronously is synchronised before and after, so the time is the
// kernel's, not its launch's.
template <class F>
void Program::profiled(size_t si, const ir::KernelContext& ctx, F&& call) {
  if (!profile_) {
    call();
    return;
  }
  if (clock_ && ctx.backend) {
    call();
    clock_->mark();
    clocked_.push_back(si);
    return;
  }
  if (ctx.backend) ctx.backend->synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  call();
  if (ctx.backend) ctx.backend->synchronize();
  step_seconds_[si] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void Program::run_steps(size_t begin, size_t end) {
  const uint32_t* ids = input_ids_.data();
  const void** ins = in_scratch_.data();
  for (size_t si = begin; si < end; ++si) {
    const auto& st = steps_[si];
    if (group_at_[si] >= 0 && group_safe(groups_[group_at_[si]])) {
      // One pass over the group's nodes; its time is the first node's in the profile.
      const Group& gr = groups_[group_at_[si]];
      const ir::Node* nodes[ir::kMaxFusedGroup];
      const void* const* gin[ir::kMaxFusedGroup];
      void* gout[ir::kMaxFusedGroup];
      uint32_t used = 0;
      for (uint32_t k = 0; k < gr.count; ++k) {
        const Step& m = steps_[si + k];
        nodes[k] = m.node;
        gin[k] = ins + used;
        for (uint32_t j = 0; j < m.num_inputs; ++j) ins[used++] = ptrs_[ids[m.first_input + j]];
        gout[k] = ptrs_[m.out];
      }
      try {
        profiled(si, st.ctx,
                 [&] { gr.kernel(st.ctx, nodes, gin, gout, static_cast<int>(gr.count)); });
      } catch (const std::exception& e) {
        fail("op '{}' (node %{} and the {} after it, run as one pass, output {}{}): {}",
             st.node->name(), st.node->id, gr.count - 1, dtype_name(st.node->dtype),
             shape_str(st.node->shape), e.what());
      }
      si += gr.count - 1;
      continue;
    }
    for (uint32_t j = 0; j < st.num_inputs; ++j) ins[j] = ptrs_[ids[st.first_input + j]];
    try {
      profiled(si, st.ctx, [&] { st.kernel(st.ctx, *st.node, ins, ptrs_[st.out]); });
    } catch (const std::exception& e) {
      fail("op '{}' (node %{}, output {}{}{}): {}", st.node->name(), st.node->id,
           dtype_name(st.node->dtype), shape_str(st.node->shape), describe_inputs(g_, *st.node),
           e.what());
    }
  }
}

void Program::record_and_replay() {
  recording_.reset();
  recorder_->begin_recording();
  try {
    run_steps(prologue_, epilogue_);
  } catch (...) {
    recorder_->end_recording(false);
    throw;
  }
  recording_ = recorder_->end_recording(true);
  recorded_ptrs_.clear();  // allocates once per recording
  for (uint32_t v : recorded_values_) recorded_ptrs_.push_back(ptrs_[v]);
  ++recordings_;
  recorder_->replay(*recording_);
}

std::string Program::summary() const {
  std::unordered_map<std::string, int> counts;
  for (auto& st : steps_) counts[st.node->name()]++;
  std::string ops;
  for (auto& [k, v] : counts) ops += fmt::format("    {}: {}\n", k, v);
  return fmt::format(
      "nodes traced: {}\nkernel calls per step: {}\nFLOPs per step: {:.0f}\n"
      "arena bytes: {} (without reuse: {})\nstate bytes: {}\nstate writes in place: {}, copied: "
      "{}\nresults written over their input: {}\nFused nodes run in one-pass groups: {} in {}\n"
      "batch inputs: {}\noutputs: {}\nops:\n{}",
      stats_.nodes_traced, stats_.nodes_compiled, stats_.flops, stats_.arena_bytes,
      stats_.naive_bytes, stats_.state_bytes, stats_.inplace_state_writes,
      stats_.copied_state_writes, stats_.inplace_results, stats_.fused_grouped, stats_.fused_groups,
      g_.batch_inputs.size(), g_.outputs.size(), ops);
}

}  // namespace cstorch::compiler
