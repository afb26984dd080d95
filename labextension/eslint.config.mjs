// `make lint`'s eslint (installed by labextension's npm devDependencies): the extension's TypeScript and
// the view modules of etlab/visualizer/static, which the notebook widgets, the offline pages and this
// extension all load. Run from the repository's root (patterns are relative to it), as `make lint` does:
//   labextension/node_modules/.bin/eslint -c labextension/eslint.config.mjs labextension/src etlab/visualizer/static
import js from '@eslint/js';
import tseslint from 'typescript-eslint';
import globals from 'globals';

export default tseslint.config(
  { ignores: ['labextension/lib/**', 'labextension/node_modules/**', 'etlab/jupyter/labextension/**', '**/*.d.ts'] },
  {
    files: ['labextension/src/**/*.ts'],
    extends: [js.configs.recommended, ...tseslint.configs.recommended],
    languageOptions: { globals: globals.browser },
    rules: { '@typescript-eslint/no-explicit-any': 'error' }  // the server's JSON is typed: src/contract.d.ts
  },
  {
    files: ['etlab/visualizer/static/**/*.js'],
    extends: [js.configs.recommended],
    languageOptions: { sourceType: 'module', ecmaVersion: 2022, globals: globals.browser },
    rules: { 'no-unused-vars': ['error', { args: 'none', caughtErrors: 'none' }] }
  }
);
