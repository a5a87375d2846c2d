"""Evaluation metrics and tasks.

Import from the submodules; this package imports nothing itself so that scoring a HumanEval
samples file does not pay for torch and transformers:

- :mod:`~fedtune.eval.rouge`: ``rouge_l``, ``rouge_l_corpus`` (FedPT, FedMKT, FewFedPIT).
- :mod:`~fedtune.eval.gsm8k`: ``extract_answer``, ``normalize_number``, ``exact_match``,
  ``gsm8k_accuracy`` (FedBiOT).
- :mod:`~fedtune.eval.humaneval`: ``load_problems``, ``check_completion``, ``pass_at_k``,
  ``evaluate_samples``, ``score_file`` (FedBiOT), on :mod:`~fedtune.eval.sandbox`.
- :mod:`~fedtune.eval.choice`: ``option_loglik``, ``mc_accuracy`` (FedMKT).
- :mod:`~fedtune.eval.diversity`: ``distinct_n`` (FedPT).
- :mod:`~fedtune.eval.memorization`: ``memorization_audit`` (FewFedPIT).
- :mod:`~fedtune.eval.loss`: ``lm_eval_loss``; :mod:`~fedtune.eval.generation`:
  ``generate_greedy``, ``greedy_generate_fn``.
"""
