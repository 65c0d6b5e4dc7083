#ifndef DEEPINFER_ENGINE_SPECULATIVE_MODE_SELECTOR_H_
#define DEEPINFER_ENGINE_SPECULATIVE_MODE_SELECTOR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace deepinfer::engine::speculative {

// Measured selection of how the adaptive engine drafts: the per-step plan (budget.h) against
// fixed draft lengths and no drafting at all.
//
// The plan predicts each step's time from models, and some costs stay outside any per-step
// model: a draft model that skipped steps first catches up on every token it missed, drafting
// steps run synchronously instead of overlapped, contexts outgrow the profiles. Steady
// fixed-length drafting (k = 1, say) can then realise more tokens per second than the plan's
// choices. So the engine runs in *modes* (0: no drafting; a fixed length L: draft L tokens per
// sequence, verify all; the plan) for *epochs* of at least `epoch_steps` measured steps and
// `epoch_seconds` of measured time, and compares the modes by realised tokens per second (tokens
// emitted over measured step periods; busy steps end an epoch sooner, see Options), per bucket of
// decoding-sequence count (1, 2, 3-4, 5-8, ..., powers of two; an epoch belongs to the bucket of
// the step that started it and counts only that bucket's steps). The first `warmup_steps` steps
// after a change of mode are run but not measured, more while the engine reports the change still
// being paid for (StillWarming).
//
// A mode's rate is (tokens per step) / (seconds per step), and the two factors are estimated
// apart, because they vary for different reasons. Tokens per step (per decoding sequence) depend
// on the text (how much of it the drafter guesses: easily +-30% between quarter-seconds) but not
// on the machine: each mode's are averaged over its recent epochs (weight `content_decay` per
// epoch on older ones).
// Seconds per step (per decoding sequence, as the tokens: the product is exactly the rate) hardly
// depend on the text but drift with the machine (other processes, the prefill node sharing the
// cores, load) by tens of percent over minutes: they are compared only between adjacent epochs.
// Each bucket has an *incumbent* mode; every other mode has a cost c = log(its seconds per
// sequence-step / the incumbent's), averaged over comparisons (weight `cost_decay`
// on older ones): two epochs of the bucket back to back, modes a then b, observe c_b - c_a =
// log(t_b / t_a), an observation of c_b if a is the incumbent, of c_a if b is, otherwise (a new
// bucket's first tour) of c_b = c_a + log(t_b / t_a). A mode's score is s = log(its tokens per
// step / the incumbent's) - c, its estimated rate relative to the incumbent's in log.
//
// Both factors are noisy: a CPU's speed swings by tens of percent within a second (measured on
// these VMs: the same loop 1.7x slower for a second, then not), so one comparison of two
// quarter-second epochs is off by about +-25%, and so is one epoch's tokens per step. A score
// therefore comes with its standard error se: the spread of the comparisons (and of each epoch's
// log tokens per sequence-step, for the mode and the incumbent), from their decayed sample
// variances blended with one pseudo-observation of sd `prior_log_sd`, over their effective
// numbers. A mode takes over the bucket when its pessimistic score s - switch_z x se (with the
// default switch_z = 0: its score) exceeds `switch_margin` and it was compared `min_comparisons`
// times. The costs are then rebased on the new incumbent.
//
// At each epoch's start, for its bucket: the incumbent runs, except that (only right after an
// epoch of the same bucket, so that the comparison is fresh) a mode never compared runs next (in
// the order given), and a loser with deficit d = 1 - exp(s + explore_z x se) (optimistic: an
// uncertain estimate is re-measured sooner) is revisited once clamp(d / explore_cost,
// min_gap_epochs, max_gap_epochs) epochs of the bucket have passed since it last ran (most
// overdue first): each loser then costs about explore_cost of the run, modes close to the
// incumbent are re-compared often (they may have overtaken it), bad ones rarely (but none
// before it was compared min_comparisons times). switch_z = explore_z = 0: point estimates only.
// With `explore_by_time` (default) the deficit is weighed by how long the loser's epochs last
// against the incumbent's (each mode's mean wall time per epoch in the bucket, warm-up steps
// included; clamped to [1/4, 4]): a long draft's steps at many decoding sequences take several
// times an incumbent's, and so do its epochs (they end after a number of steps), so a revisit
// costs that much more of the run; a loser still short of min_comparisons comparisons then waits
// min_gap_epochs x that ratio (when above 1). Measured live (issue 12, session 11, draft model at
// concurrency 32): without it a quarter of the time went to revisits (k = 4 and 8 epochs of
// 1.1-1.6 s against k = 1's 0.47 s), where the gaps meant about 1%.
//
// Challengers. A mode rated above the incumbent (by more than switch_margin) but compared fewer
// than min_comparisons times cannot take over yet. It is revisited `confirm_gap_epochs` epochs of
// the bucket after its last trial, before any loser that is due, instead of waiting its turn
// among the other modes short of comparisons: that turn costs a dozen epochs or more at the old
// incumbent's rate (an epoch lasts at least epoch_seconds: seconds of a busy bucket, minutes of one
// that the load visits now and then). Measured (issue 12, session 41, a draft-model node at 8
// concurrent requests, before this rule): the 5-8 bucket rated k = 1 at 111% and then 115% of the
// plan after its first two trials, then ran the plan through trials of k = 2, 8 and 4 before
// k = 1's third, a round later.
//
// An epoch also ends early (too short to compare, then) when a step's decoding count falls in
// another bucket whose incumbent is not the epoch's mode (`follow_bucket`, default on): without
// it, epochs begun at 1-4 decoding sequences ran the plan on at 5-8, where k = 1 was the incumbent,
// and took 22% of the draft-model node's time there (issue 12, session 11, concurrency 8). A
// bucket not yet run, or run by the epoch's mode, lets the epoch go on, but not an interleaved
// trial (below), whatever that bucket runs: its partner is the incumbent of the bucket it began
// in, and only that bucket's steps count. A trial of the plan begun at one sequence, against k = 4
// there, ran on through 2-8 sequences, where the plan was the incumbent, with k = 4 in runs of 3
// in every other run until each side had its steps and seconds (~50 steps of 5-8 sequences): 21%
// of a draft-model node's time at 8 concurrent requests ran k = 4 at 5-8 sequences, 6% slower than
// the plan there, counted for nothing (issue 12, session 26).
//
// Draft lengths are unimodal in rate (each longer draft adds a verified position whose survival
// only falls, and a draft round's cost): past the best length, a longer one is slower than the
// next shorter one; below it, a shorter one is slower than the next longer one. So a fixed length
// (none = 0 among them) is *pruned*, neither toured nor revisited, while its neighbour on the way
// to the best measured length (by point estimates), itself not that best, is, even optimistically
// (+ explore_z x se) and after min_comparisons comparisons, below `prune_below` of the
// incumbent (slower than the best, the neighbour shows that the peak is not beyond it), or is
// pruned itself: a draft model's k = 4 and 8, 25-50% behind, are then no longer measured in
// every bucket once k = 2 is known to be behind. The plan is never pruned. Default 0.9 (with the
// interleaved trials below, whose estimates are firm enough; adjacent epochs' were not, so it was
// off by default until session 13).
// Two exceptions. No drafting (length 0) is never pruned: it is not a shorter draft but the
// absence of a draft round (and of a draft model's upkeep), so its rate is no point on the
// lengths' curve, and a draft model's k = 1 can be slower than both no drafting and k = 4. And a
// length whose own estimate (point, inherited or measured) is at least prune_below of the
// incumbent is not pruned by a neighbour: its figure contradicts the inference from the
// neighbour's (noise, or no unimodality). Without them a draft-model node at 32 concurrent
// requests kept its 9-16 bucket on the plan at 82% of a node without speculation's tokens per
// second there (11% of its time; issue 12, session 24): k = 2 at 88% pruned k = 1 (rated 97%,
// one trial of its own at 1.035) and with it no drafting, whose 84% was inherited from the 5-8
// bucket and never once measured in 9-16.
//
// Defaults: point estimates (switch_z = explore_z = 0), cost_decay 0.9 (0.7 until issue 12, session
// 22: a new trial of +-25% then moved a score by a third, and single trials handed buckets to
// modes 5-10% slower, such as k = 2 over the plan and k = 4 at one sequence for a draft model; at
// 0.9 about a tenth; measured beside 0.7 in the same rounds of two sweeps: a draft model +1-3% at
// 8 and 32 concurrent requests and +-1% at one, n-gram between -3% and +8%), the gaps weighed by
// epoch duration (explore_by_time). With switch_z 2, explore_z
// 1, cost_decay 0.9 and prune_below 0.95 the selector realised 1-3 points more of the best mode's
// rate in simulations whose first mode was (nearly) the best, but the live sweep (issue 12, session
// 10) measured it behind the best fixed length in four cells of six, its n-gram node keeping the
// plan in buckets where it rated k = 4 8-24% faster: decayed estimates never grow certain (their
// effective number stays below (1 + decay) / (1 - decay)), so two standard errors of +-30% epochs
// are a permanent ~20% barrier, and buckets stay with their first incumbent. The options stay for
// further work.
//
// Interleaved trials (`interleave`, default on). The comparisons above pit epochs run at
// different times against each other, so they carry the machine's drift and the text's: +-25% for
// one pair of quarter-second epochs, and estimates that stay uncertain by ~10% (cost_decay 0.7),
// which handed buckets to modes 10-15% slower (issue 12, session 12: k = 1 ran a third of the
// draft-model node's time at 32 decoding sequences, rated 96% of the plan while its steps emitted
// 15% fewer tokens per second). With `interleave` a revisit or tour of mode m is instead one
// epoch of alternating steps, m then the incumbent then m ..., after m's warm-up steps: both
// modes run under the same machine speed and on the same text, a step apart, so one such epoch
// observes m's score itself, s = log(m's tokens per second / the incumbent's) over the epoch's
// measured steps of its bucket (each side needs half the epoch's steps there). A mode's score is
// the decayed mean of its observations (weight `cost_decay` on older ones; its standard error from
// their spread as above); when a mode takes over, every score is rebased on it (s_k - s_new, the
// old incumbent's -s_new). The epoch ends once each side has run the epoch's steps and seconds.
// The incumbent's own epochs only measure (content, epoch time); the adjacency of epochs plays no
// part. Alternation costs a draft model a little: a drafting step after a non-drafting one feeds
// one token more. A trial also ends early, once each side has run min(short_epoch_steps,
// epoch_steps) measured steps in the bucket, when the mode on trial realised less than
// `trial_stop_below` of the incumbent's rate so far: a clear loser is clear by then, and its slow
// steps are what its trial costs (measured at 8 concurrent requests, issue 12, session 13: a draft
// model's k = 4 and 8 trials, 16 steps a side at 2-3 times the incumbent's time per token, took a
// fifth of the node's time while the selector learnt). It also needs each side's measured steps to
// cover `trial_stop_sequence_steps` x log(trial_stop_below) / log(ratio) sequence-steps (all of
// them for a ratio just below trial_stop_below, a third at half the incumbent's rate): a few
// steps of one or two sequences say little (an n-gram drafter that finds no match emits 1 token
// where a step that matches emits 5), and an early stop biases the loser's score down (only the
// challenger's unlucky trials are cut short, while its lucky ones run on and regress to the
// mean): with 4 steps a side at one sequence the n-gram node's trials rated k = 4 5-18% below
// the plan, which measured the same end to end (issue 12, session 14). A deep deficit is clear
// sooner, and a draft model's slow lengths are what early stops save most on. Simulated (a mode
// at 0.85 at one sequence, tokens 1-5 a step): estimates average 0.756 without the floor, 0.841
// with a flat one, 0.837 scaled; a flat floor ran a draft model's k = 8 trials (0.45) 16 steps a
// side at one sequence, the scaled one 9.
// A trial compares within itself, so it need not follow a finished epoch of its bucket, as a
// comparison of adjacent epochs must (`trial_any_epoch`, default on: a tour or revisit may start
// at any epoch of the bucket, a revisit right after one of the bucket's incumbent). Buckets that
// the decoding count only passes through (the ramp of a burst of arrivals, the tail as they
// finish) rarely see two finished epochs back to back, and kept what they inherited: at 32
// concurrent requests a draft-model node's 9-16 bucket ran the plan inherited from one sequence
// (11% of the node's time at 68% of a node without speculation's tokens per second there, and
// its draft model catching up on every sequence's tokens since the frozen 17-32 bucket, 3% of
// the time) while 17-32 had frozen with no drafting (issue 12, session 18).
// Alternating single steps, each side's steps start from the state the other side's step left:
// where a step's outcome depends on the step before it (an n-gram draft rejected leaves the
// request just past a divergence from the text it copies, where the next draft matches less),
// a mode whose steps leave that state often is measured against the other's better starts, and
// the other against its worse ones. With `trial_run_steps` N > 1 the sides alternate runs of N
// steps, and each run's first step is not measured (N = 3: a third of the trial's steps).
// Default 3 (1 until issue 12, session 24), at up to 4 decoding sequences (below).
// Runs only where steps are cheap (`trial_run_max_decoding`, default 4, the worker flag's 0; 0 =
// every bucket). At one sequence a draft model's trials of single steps are biased by the steps'
// carry-over far beyond their noise: a draft of 4 after one of 2 accepted 0.94 tokens where it
// accepted 1.38 after one of 4 that had accepted as many (the same 1 draft and a correction), and
// trials rated k = 4 at 90% of k = 2 where the two fixed-length nodes ran k = 4 7% faster (issue
// 12, session 24). Runs of 3 gained 2-3% at 1 and 8 concurrent requests (session 19) but lost 6% at
// 32, where a run's unmeasured first steps made trials a quarter of the node's time; with this
// option the runs apply only to the small buckets, whose steps take a few milliseconds. Measured
// beside single steps in the same rounds of two sweeps (session 24, decode tokens/s over no
// speculation): a draft model +4% and +4% at 1 request (its node then ran k = 4 at one sequence, at
// the k = 4 node's rate, where single-step trials had handed k = 2 the bucket), -1% and +2% at 8,
// +4% and +4% at 32; n-gram +4% and -4% at 1 (its plan runs 99% of the time either way), +2% and
// -1% at 8, -4% and +1% at 32. Tried again in session 26 at every count (0), beside 4 in the same
// rounds of one sweep: a draft model -5% at 8 and -4% at 32 concurrent requests (its node then held
// k = 4 at 17-32 sequences, 72% of its time), +1% at 1; n-gram level at 8 and 32. Step traces had
// suggested it (the plan's steps at 17-32 after one of its own emitted 2.79 tokens/ms, after a k =
// 2 step 2.49), but those after its own came from its epochs as the incumbent, at other times: the
// machine's drift more than carry-over.
//
// Runs of steps and the step before. A forward pass also costs more right after one of another
// shape: measured on a 2-core AVX2 VM (issue 12, session 27; demo model, one sequence, context 32)
// a one-token forward pass took 1.0-1.25 ms among one-token passes, 1.6-2.1 ms right after a
// 17-token one, and still as much in the second one-token pass after it. In an n-gram node's
// trials at one sequence (runs of 3), k = 1's forward passes took 2.26, 2.19 and 2.01 ms by place
// in the run, 1.99 ms in a node running k = 1 alone: the measured steps of a short mode's runs
// still pay for the long mode's steps before them. `trial_run_unmeasured` leaves more of each
// run's first steps out (with longer runs, so that each still measures some).
//
// Runs of text. Runs of equal step counts give the two sides equal shares of the trial's steps,
// not of its text, and a long draft crosses the easy stretches (long copies, where drafts are
// accepted whole) in a few steps, a short one in many: of the steps where the text is easy the
// short mode runs fewer than it would alone, so its steps are rated on harder text than its own
// and the long mode's on easier (an inspection paradox, whatever the modes' true rates). Measured
// on an n-gram node at one sequence (issue 12, session 28): k = 1 in the plan's trials emitted
// 1.62 tokens a step and found no draft in 24% of its steps; a node running k = 1 alone, on the
// same prompts and (greedy) the same answers, 1.76 and 14%; k = 2, 2.15 against 2.34. With
// `trial_run_tokens` R > 0 (where runs apply) a run instead lasts until its measured steps (after
// its trial_run_unmeasured unmeasured ones) have emitted R tokens per decoding sequence: each
// side's measured steps then cover as much of every stretch of the text as the other's, and its
// rate over them is close to its rate alone (counting the unmeasured steps' tokens too would
// leave a long draft's runs on easy text mostly unmeasured). 0 (the default): runs of
// trial_run_steps steps. Measured in session 28 (1 and 8 concurrent requests, decode tokens/s,
// 5 rounds each, beside 0 in the same rounds): an n-gram node with 16 won 5 of 5 rounds at 1 (by
// 2-31%; it then held k = 1 at one sequence, level with a k = 1 node, where 0 kept the plan) and
// 4 of 5 at 8; with 8, 4 and 3. A draft-model node with 8 won 3 of 5 at each; with 16, 2 of 5 at
// 1 and 1 of 5 at 8 (median 0.83 of 0 there, on a machine then 40% slower than in the other
// runs). So the option's default stays 0; the worker flag `--spec_trial_run_tokens` defaulted to
// 16 with n-gram drafts and 0 with a draft model, and since session 41 to 16 for both, with runs
// up to 8 decoding sequences, and since session 44 at any count (`--spec_trial_run_max_decoding`;
// node/worker_flags.h says why).
// A run of text ends after the step that brings its tokens to R, which is more often a long step,
// a draft accepted whole inside a copied stretch: the other side's run then begins in the copy,
// and with trial_run_unmeasured 1 its first step, a long draft's best, is not measured. In an
// n-gram node's trials at one sequence (issue 12, session 34) the plan's unmeasured first steps
// emitted 6.7-9.6 tokens and its measured ones 3.5-4.4 (k = 4: 3.6 against 3.2): two nodes of two
// rated k = 4 or k = 8 at 94-100% of the plan and kept them, at 1.69 and 1.82 tokens/ms where a
// node running the plan alone ran 2.07 (k = 4 alone 1.87). Counting every step (0), the plan's
// runs that begin inside a copy favour it instead (DraftModeSelectorTest.
// UnmeasuredRunStartsHideALongDraftsCopies: a long draft 7% faster alone is rated 21% below its
// rate with 1 and 42% above with 0); live, nodes with 0 rated k = 4 at 67-72% and k = 8 at 79-90%
// of the plan at one sequence and kept the plan, in 2 sweeps of 2. So the worker flag
// `--spec_trial_run_unmeasured` defaults to auto: 0 with n-gram drafts, 1 with a draft model (whose
// first step after the other mode's also catches the draft model up).
//
// A bucket *freezes* when its incumbent drafts nothing (length 0) and every other mode not pruned
// was compared min_comparisons times and is, even optimistically (+ explore_z x se), below
// `freeze_below` of it: its incumbent's steps then tell the engine not to keep a draft model's
// cache up to date (Choice::upkeep false; that upkeep costs about 4% of a step at 32 decoding
// sequences, issue 12, session 12, so without this a node whose drafting never pays stays that
// much below one without speculation), and its losers are revisited no sooner than
// `freeze_epochs` epochs of the bucket apart: each such trial first catches up on everything the
// cache missed (its warm-up, StillWarming), about 7 steps' worth at 32 sequences, so it must be
// rare, and is shared: every `freeze_epochs` epochs of the bucket its losers are revisited in a
// round, one after another (each after an epoch of the incumbent; the comparisons that froze it
// count as the first round). The bucket thaws when a trial measures a loser above freeze_below. 0:
// never freezes. Default 0.99, nearly any loser: no drafting is rated as it runs frozen (the
// engine leaves the upkeep out of its steps' time), so an unfrozen bucket's incumbent runs that
// upkeep's few percent below its own rating, a certain cost, for quicker revisits of a mode that
// measured slower. And a plan that hardly drafts rates within a few percent of no drafting (it is
// no drafting plus its upkeep), so at 0.95 a bucket where drafting did not pay never froze (issue
// 12, session 16, draft model at 8 and 32 concurrent requests: the plan at 95-96%, buckets 5-8
// and 3-4 unfrozen; 0.92 and 1.005 of a node without speculation at 0.95, 1.106 and 1.132 at 0.99,
// the same rounds). A frozen bucket's estimates go stale between rounds (at 8 requests, 512
// epochs of the bucket outlasted a 35-minute sweep), but revisiting every 64 epochs measured
// worse (0.913 against 0.994 of no speculation, the same rounds: each round's catch-up).
//
// Catch-up charge (`catch_up_charge`, default on). Steps in which a draft model catches up (on a
// new request's prompt, or after a change of mode on every token its sequences decoded without
// drafts) are left out of the rates above: a catch-up is a one-off, not the mode's steady cost, and
// left in it would make one trial's figures depend on who arrived during it. But it is a cost that
// drafting pays and no drafting does not, and where the count enters a drafting bucket from a
// frozen one it is most of that cost: at 32 concurrent requests a draft-model node's 9-16 bucket,
// which the count passes through as a round's requests finish, rated the plan 4% above no drafting
// while its steps there, catch-up included, emitted 31% fewer tokens per second than a node
// without speculation's (the 17-32 bucket frozen, so every sequence arrived there with ~200
// undrafted tokens; issue 12, session 20). So while a drafting mode is a bucket's incumbent, the
// bucket keeps the time T of its steps (every mode, measured or not) and the part C of it that
// drafting modes' unmeasured steps spent catching up (Observe's catch_up_seconds), both decayed
// over `catch_up_horizon_seconds` of steps; every drafting mode's score there is lowered by
// log(T / (T - C)) against no drafting (the rate it would have had with its catch-ups in),
// drafting modes among themselves unchanged. A bucket where catch-ups eat drafting's gain then
// passes to no drafting and freezes, and keeps the charge measured while drafting held it: under
// no drafting only trials draft, each first catching up on the steps before it, which is what
// that trial costs, not what drafting would pay per step as the incumbent. A revisit's trial
// that measures drafting ahead by more than the charge hands the bucket back (and measures it
// anew).
//
// The first bucket starts with the first mode given as incumbent; a later one inherits the nearest
// bucket's incumbent and estimates (costs, and tokens per step per decoding sequence until it
// measures its own, each mode needing one comparison of its own before a long gap), touring only
// the modes that bucket never compared. The inherited scores count as `inherit_weight`
// comparisons (at most) against the bucket's own: at 1 (the default) one inherited figure still
// weighs 40% after the bucket's first trial of a mode (cost_decay 0.7), which kept a draft model's
// k = 1 at 87% of the plan at 5-8 sequences (inherited from one sequence, where it is 70-80%)
// after a trial there measured it level (issue 12, session 20).
//
// Trials cut short (`weigh_cut_trials`, default on). A trial that ends because the count left its
// bucket (follow_bucket) before each side ran its steps is one observation of fewer steps, and a
// few steps of one or two sequences are off by +-50%: it weighs as w = the share of a whole
// trial's steps its thinner side ran in the bucket, max(steps / epoch_steps, min(steps /
// short_epoch_steps, sequence-steps / short_epoch_sequence_steps)), at most 1, in the mode's
// decayed mean and spread, and as w comparisons toward min_comparisons. Without it a
// trial of 3 steps a side at 2 sequences, measuring no drafting 61% above a draft length of 4,
// handed that bucket to no drafting (its inherited figures one comparison short of
// min_comparisons): the node then ran 2 sequences at 0.97 tokens/ms where a node drafting one
// token ran 1.50 (issue 12, session 21, draft model at 8 concurrent requests).
//
// Catching up while not drafting (`off_epoch_catch_up`, default on = as before). An unfrozen
// bucket whose incumbent drafts nothing keeps the draft model's cache up to date in its
// incumbent's epochs (the upkeep), and when the count enters it from a frozen bucket every
// sequence is hundreds of tokens behind: that upkeep is then a catch-up of everything the frozen
// bucket skipped, paid by steps that draft nothing. Measured (issue 12, session 24, draft model at
// 32 concurrent requests, trials in runs of 3 at up to 4 sequences): 17-32 frozen on no drafting,
// 9-16 held by no drafting unfrozen (the plan at 99%), whose steps ran at 2.14 tokens/ms against
// 3.14 in a node without speculation. Off: those epochs' upkeep feeds only sequences within the
// steady bound (SpecOptions::draft_upkeep_tokens), a trial's drafting steps catch up the others
// (its warm-up). Not measured in a sweep yet.
//
// Short dips out of a frozen bucket (`catch_up_delay_steps`, default 8; 0 = hand over at once, as
// before). A frozen bucket's incumbent epochs draft nothing and feed the draft model nothing, so
// every sequence falls behind it by each token it decodes there (and a new request by its whole
// prompt). When the count moves to a bucket held by a drafting mode, that mode's first step
// catches all of it up. At 8 concurrent requests the count mostly sits at 5-8 (frozen on no
// drafting, for a draft model) and dips to 4 for one to three steps whenever a request ends before
// the next arrives: 9 such dips in three measured rounds cost 278 ms of catch-up in 362 ms of
// steps, 2% of the run, for a few steps of drafting that gained nothing (issue 12, session 32;
// the round's tails, which stay below 5 for hundreds of steps, caught up 374 ms in 5 s). So the
// epoch of a frozen bucket's incumbent without upkeep runs on, unmeasured, while the count stays
// in buckets whose incumbent is another mode, for up to catch_up_delay_steps steps in a row;
// then the new bucket's incumbent takes over as before. Back in the frozen bucket, or in one that
// it shares its incumbent with, the count starts again.
//
// Lossless: the mode of a step depends only on earlier steps' measurements and counts.
// Not thread-safe: one caller (the engine's scheduler thread).
class DraftModeSelector {
 public:
  // The plan's mode in `lengths` (any other value >= 0 is a fixed draft length, 0 none).
  static constexpr int kPlan = -1;

  struct Options {
    int epoch_steps = 16;         // >= 1
    double epoch_seconds = 0.25;  // >= 0
    // An epoch also ends (its seconds run) after short_epoch_steps measured steps once they cover
    // short_epoch_sequence_steps sequence-steps (steps x decoding sequences): a step of 32
    // sequences measures tokens per sequence-step as well as 32 steps of one, and takes 20-30
    // times as long on a CPU, so 16 of them would make epochs of seconds and learning slow.
    int short_epoch_steps = 4;                  // >= 1 (above epoch_steps: epoch_steps)
    double short_epoch_sequence_steps = 128.0;  // >= 0
    int warmup_steps = 2;                       // >= 0
    int max_warmup_steps = 16;                  // >= warmup_steps: with StillWarming
    double cost_decay = 0.9;                    // in [0, 1)
    double content_decay = 0.95;                // in [0, 1)
    double switch_margin = 0.01;                // >= 0
    // Uncertainty and pruning (see above): standard errors in a switch's pessimistic score and a
    // revisit's optimistic one, the sd of one observation assumed before (and blended with) the
    // measured spread, and the relative rate below which a neighbour prunes the lengths past
    // it. Off by default (point estimates, every loser revisited): see "Defaults" above.
    double switch_z = 0.0;        // >= 0 (tried: 2, with explore_z 1, cost_decay 0.9)
    double explore_z = 0.0;       // >= 0
    double prior_log_sd = 0.25;   // >= 0
    double prune_below = 0.9;     // in [0, 1]; 0: no pruning (tried with adjacent epochs: 0.95)
    bool explore_by_time = true;  // revisit gaps weighed by the epochs' wall time (above)
    // An epoch ends early when the decoding count enters a bucket whose incumbent is another
    // mode (above).
    bool follow_bucket = true;
    // Revisits and tours are interleaved trials (above); false: adjacent epochs are compared.
    bool interleave = true;
    // With interleave: a trial may start at any epoch of its bucket (a revisit: one right after
    // an epoch of the incumbent there), not only right after a finished epoch of the same
    // bucket (see above); false: only then, as adjacent epochs need.
    bool trial_any_epoch = true;
    double trial_stop_below = 0.8;  // in [0, 1]: trials of clear losers end early; 0: never
    // ... and only once each side's steps cover this many sequence-steps (steps x decoding
    // sequences) x log(trial_stop_below) / log(its ratio): see above.
    double trial_stop_sequence_steps = 32.0;  // >= 0
    // A trial alternates runs of this many steps of each side, the first step of each run left
    // unmeasured when above 1 (see above); 1: single steps, every one measured.
    int trial_run_steps = 3;  // >= 1 (1 until issue 12, session 24)
    // Of each run (trial_run_steps above 1), this many first steps are not measured (at most
    // trial_run_steps - 1): see "Runs of steps and the step before" above.
    int trial_run_unmeasured = 1;  // >= 0 (0: every step; see "Runs of text" above)
    // > 0: a run lasts until its measured steps have emitted this many tokens per decoding
    // sequence instead of trial_run_steps steps, where runs apply (trial_run_max_decoding): see
    // "Runs of text" above. 0: runs of steps.
    double trial_run_tokens = 0.0;  // >= 0, finite
    // Runs of trial_run_steps only in buckets of at most this many decoding sequences (single
    // steps above); 0: every bucket. See "Runs only where steps are cheap" above.
    int trial_run_max_decoding = 4;  // >= 0 (0 until issue 12, session 24)
    double freeze_below = 0.99;      // in [0, 1]: frozen buckets (above); 0: none
    int freeze_epochs = 512;         // >= 1: their revisits' gap, in epochs of the bucket
    double explore_cost = 0.002;     // > 0: five losers cost about 1% of a long run
    int min_gap_epochs = 4;          // >= 1
    int max_gap_epochs = 128;        // >= min_gap_epochs
    // A loser compared fewer times than this is revisited after min_gap_epochs whatever its
    // deficit, and a challenger takes over only once compared this many times: one pair of
    // epochs is too noisy to set a long gap on, or to hand the bucket to.
    int min_comparisons = 3;  // >= 1
    // A challenger short of min_comparisons is revisited after this many epochs of the bucket,
    // before any loser that is due (see "Challengers" above).
    int confirm_gap_epochs = 1;  // in [1, min_gap_epochs]
    // Catch-up charge (above), and the step time (seconds, > 0) over which its figures decay
    // (weight exp(-t / horizon) on what is t seconds of the bucket's steps old, counted while a
    // drafting mode holds it).
    bool catch_up_charge = true;
    double catch_up_horizon_seconds = 30.0;
    // What a new bucket inherits of its neighbour's scores counts as this many comparisons (at
    // most; in (0, 1]) against the bucket's own: see "The first bucket" below.
    double inherit_weight = 1.0;
    // A trial cut short by the count leaving its bucket weighs as the share of a whole trial's
    // steps its thinner side ran (see "Trials cut short" above); false: as a whole trial.
    bool weigh_cut_trials = true;
    // Whether the upkeep of an incumbent's epochs that draft nothing also catches up sequences
    // far behind (Choice::catch_up; see "Catching up while not drafting" above).
    bool off_epoch_catch_up = true;
    // Entry delay (see "Short dips out of a frozen bucket" above): while a frozen bucket's
    // incumbent epoch runs without upkeep, a count that moves to a bucket held by a drafting mode
    // hands over only after this many consecutive steps there; 0: at once.
    int catch_up_delay_steps = 8;  // >= 0
  };

  struct Choice {
    int mode = 0;          // index into the modes given to Create
    bool measured = true;  // false for the warm-up steps after a change of mode
    // Whether a step that drafts nothing should keep a draft model's cache up to date: false
    // in a frozen bucket's epochs of its incumbent (see above).
    bool upkeep = true;
    // With upkeep: whether it also feeds sequences far behind (a whole new prompt, or what a
    // frozen bucket skipped); false in the epochs of an incumbent that drafts nothing when
    // off_epoch_catch_up is off.
    bool catch_up = true;
  };

  // `modes`: the modes' draft lengths (kPlan, 0 or a fixed length), distinct, non-empty.
  static absl::StatusOr<DraftModeSelector> Create(std::vector<int> modes, const Options& options);

  // The mode of the next step, which has `decoding` (>= 1) decoding sequences. Ends the current
  // epoch and starts one (for that count's bucket) once the current one has run its measured
  // steps and seconds.
  Choice Choose(int decoding);
  // A step that ran in mode `mode` (as Choose returned it) with `decoding` decoding sequences:
  // its emitted tokens (>= 0) and measured period (> 0 seconds); `measured` as Choose said.
  // Only measured steps count toward the epoch; only those of the epoch's mode and bucket feed
  // its rate. Invalid values and unknown modes are ignored. `catch_up_seconds` (in [0, seconds]):
  // of the period, the time a draft model spent catching up beyond a steady round (see "Catch-up
  // charge" above); counted only for an unmeasured step of a drafting mode (a measured step's
  // rate already holds it) in a bucket whose incumbent drafts.
  void Observe(int decoding, int mode, bool measured, double tokens, double seconds,
               double catch_up_seconds = 0.0);
  // The step Choose last returned as unmeasured (a warm-up step) was still paying for the change
  // of mode (a draft model catching up on the tokens of steps it skipped, more than a steady
  // round feeds): the next step is left out too, up to max_warmup_steps after the change.
  void StillWarming();

  int num_modes() const { return static_cast<int>(lengths_.size()); }
  int length(int mode) const { return lengths_[mode]; }
  // In the bucket of `decoding`: the incumbent (-1 before any epoch there), and a mode's
  // estimated rate relative to it, exp(score) (1 for the incumbent, 0 if never compared).
  int Incumbent(int decoding) const;
  double Relative(int decoding, int mode) const;
  // The current epoch's mode (in an interleaved trial the mode on trial).
  int current() const { return current_; }
  // In an interleaved trial the incumbent it alternates with, else -1.
  int partner() const { return partner_; }
  int64_t epochs() const { return epochs_; }
  int64_t explorations() const { return explorations_; }  // epochs run by a non-incumbent
  int64_t switches() const { return switches_; }          // changes of incumbent
  // Steps a frozen bucket's epoch ran on in another bucket (catch_up_delay_steps).
  int64_t held_steps() const { return held_steps_; }
  // The rate (tokens/s) of the last finished epoch that could be compared, and its mode (-1:
  // none). For logs.
  double last_epoch_rate() const { return last_.rate; }
  int last_epoch_mode() const { return last_.mode; }
  // The last finished interleaved trial (epoch -1: none yet): its epoch, bucket, mode on trial
  // and the incumbent it alternated with, its observation log(rate / the incumbent's) and weight,
  // each side's measured steps in the bucket, and the mode's score right after it (before any
  // switch). For logs.
  struct LastTrial {
    int64_t epoch = -1;
    int bucket = -1;
    int mode = -1;
    int incumbent = -1;
    double log_ratio = 0.0;
    double weight = 0.0;
    int steps = 0;
    int incumbent_steps = 0;
    double score = 0.0;
  };
  const LastTrial& last_trial() const { return last_trial_; }
  static int Bucket(int decoding);
  // A bucket's decoding counts, "1", "3-4", "17-32".
  static std::string BucketName(int bucket);
  // Per bucket with data: each mode's rate relative to the incumbent in percent, the incumbent
  // marked with '*', e.g. "1: plan 91 k1 100* k2 97 off 70; 5-8: ...". For logs.
  std::string DebugString() const;

 private:
  // Exponentially weighted mean and spread of observations (weighted Welford), each new one of
  // weight 1, older ones decayed.
  struct Spread {
    double weight = 0.0;   // sum of weights
    double weight2 = 0.0;  // sum of squared weights (the mean's effective number: w^2 / w2)
    double mean = 0.0;
    double m2 = 0.0;  // sum of weight x (x - mean)^2
    // One observation x of weight w (in (0, 1]).
    void Add(double x, double decay, double w = 1.0);
    // Squared standard error of the mean, the variance blended with one pseudo-observation of
    // `prior_var`; prior_var when empty.
    double MeanVariance(double prior_var) const;
  };
  static constexpr double kEpochTimeWeight = 0.3;
  struct ModeStats {
    double cost = 0.0;       // log(seconds per step / the incumbent's), averaged
    double weight = 0.0;     // decayed number of comparisons (0: never compared)
    double comparisons = 0;  // undecayed; a trial counts as its weight (weigh_cut_trials)
    Spread cost_spread;      // of the comparisons (its mean shifts with rebasing; not used)
    Spread content_spread;   // of its epochs' log(tokens per sequence-step)
    Spread paired;           // interleave: its trials' log(rate / the incumbent's)
    double tokens = 0.0;     // emitted tokens and sequence-steps (steps x decoding sequences)
    double seq_steps = 0.0;  // of its epochs (content_decay)
    // Inherited from a neighbouring bucket (until own data): log(tokens per sequence-step)
    // relative to that bucket's incumbent's.
    bool has_prior = false;
    double prior_log_tps = 0.0;
    int64_t last_epoch = -1;  // the bucket's epoch count when the mode last ran an epoch
    // Mean wall time of its epochs begun in this bucket (every step of the epoch's mode, warm-up
    // included; weight kEpochTimeWeight on the newest), 0 before the first.
    double epoch_seconds = 0.0;
  };
  struct BucketStats {
    std::vector<ModeStats> modes;
    int incumbent = -1;
    int64_t epochs = 0;  // epochs of this bucket
    // Frozen: the epoch at which the latest round of revisits began, and whether it runs.
    int64_t thaw_round = -1;
    bool thaw_start = false;
    // Catch-up charge: decayed time of the bucket's steps while a drafting mode was its
    // incumbent, and of it the drafting modes' unmeasured steps' catch-up time.
    double charge_base_seconds = 0.0;
    double catch_up_seconds = 0.0;
  };
  // The last finished epoch whose rate could be compared (global epoch index).
  struct LastEpoch {
    int64_t epoch = -1;
    int bucket = -1;
    int mode = -1;
    double rate = 0.0;  // tokens per second
    double seconds_per_step = 0.0;
  };
  DraftModeSelector(std::vector<int> lengths, const Options& options);
  BucketStats& BucketAt(int b);
  int Decide(int b);
  void FinishEpoch();
  void Compare(BucketStats& bucket, int mode, double observed_cost);
  // Interleaved trials: one observation of `mode`'s log rate relative to the incumbent, of
  // weight w in (0, 1] (weigh_cut_trials).
  void ComparePaired(BucketStats& bucket, int mode, double log_ratio, double w);
  // The weight of the trial now ending (weigh_cut_trials): 1 if it ran whole.
  double TrialWeight() const;
  // Whether the epoch has run its steps and seconds (each side of a trial).
  bool EpochOver() const;
  void MaybeSwitch(BucketStats& bucket);
  double Score(const BucketStats& bucket, int mode) const;
  // log(T / (T - C)) of the catch-up charge (0 without one): what a drafting mode's score loses
  // against no drafting in the bucket.
  double CatchUpCharge(const BucketStats& bucket) const;
  // Whether the bucket is frozen (see above).
  bool Frozen(const BucketStats& bucket) const;
  // Whether a fixed length is pruned (see above) in this bucket.
  bool Pruned(const BucketStats& bucket, int mode) const;
  // The standard error of Score (0 for the incumbent).
  double ScoreError(const BucketStats& bucket, int mode) const;

  std::vector<int> lengths_;
  Options options_;
  std::vector<BucketStats> buckets_;
  int current_ = 0;
  int epoch_bucket_ = -1;  // -1 before the first epoch
  // One mode's measured steps in the current epoch.
  struct Side {
    int steps = 0;             // measured steps
    double seq_steps = 0.0;    // their sequence-steps
    double seconds = 0.0;      // their time
    double rate_tokens = 0.0;  // tokens and seconds of those in the epoch's bucket
    double rate_seconds = 0.0;
    int rate_steps = 0;
    double rate_seq_steps = 0.0;
    // Tokens per second in the epoch's bucket (rate_seconds > 0).
    double Rate() const { return rate_tokens / rate_seconds; }
  };
  Side side_[2];                     // the epoch's mode, and in a trial its partner
  int partner_ = -1;                 // interleaved trial: the incumbent alternated with
  bool partner_next_ = false;        // whose turn after the warm-up: the partner's
  int run_taken_ = 0;                // steps of the current side's run (trial_run_steps)
  int run_steps_ = 1;                // the current epoch's run length (trial_run_max_decoding)
  double run_tokens_ = 0.0;          // tokens per decoding sequence of the run (trial_run_tokens)
  bool text_run_step_ = false;       // the step Choose last returned belongs to a run of text
  bool epoch_upkeep_ = true;         // Choice::upkeep of the epoch's steps
  bool epoch_catch_up_ = true;       // Choice::catch_up of the epoch's steps
  double epoch_wall_seconds_ = 0.0;  // every step of the epoch's mode, measured or not
  int warmup_left_ = 0;              // Choose calls left unmeasured after a change
  int warmup_taken_ = 0;             // of them, returned since the change
  bool last_unmeasured_ = false;     // the latest Choose returned measured = false
  LastEpoch last_;
  LastTrial last_trial_;
  int64_t epochs_ = 0;
  int64_t explorations_ = 0;
  int64_t switches_ = 0;
  int delay_streak_ = 0;  // consecutive steps held (catch_up_delay_steps)
  int64_t held_steps_ = 0;
};

}  // namespace deepinfer::engine::speculative

#endif  // DEEPINFER_ENGINE_SPECULATIVE_MODE_SELECTOR_H_
